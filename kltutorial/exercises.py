"""Checkers for the book's code exercises: ``check("k3", my_k3)`` (each section's "Exercises").

A code exercise asks the reader to write, in a few lines, a function the package already has. The
checker runs the reader's function on fixed, hidden cases, runs the package's own implementation on
the same inputs, and prints one line, or a few:

* ``k3: correct (all 5 hidden cases)``;
* ``k3: not implemented yet (replace the stub's `raise NotImplementedError`)``, for the stub the
  exercise ships with, so that the stored notebook shows no error;
* or the first case that fails: what it tests, its input, the expected and the reader's output, and
  the first position where they differ (or the exception the function raised).

It is deterministic: the cases are fixed numbers (no randomness), built afresh for every run (a
function that changes its input in place cannot change the next case, nor the expected value), and
run in order up to the first failure. Warnings raised inside the reader's function are not shown: the
checker judges values. :func:`verdict` returns the same result as a :class:`Verdict` for code (the
notebooks' hidden assertions and ``tests/test_exercises.py``).

========================  ====================================================  =======
checker                   the package's implementation                          section
========================  ====================================================  =======
``"kl_divergence"``       :func:`kltutorial.exact.categorical.kl_divergence`    2
``"k3"``                  :func:`kltutorial.estimators.k3`                      4
``"shape_rewards"``       :func:`kltutorial.objective.shape_rewards`            5
``"ziegler_update"``      :class:`kltutorial.controllers.AdaptiveKLController`  7
``"token_mean"``          :func:`kltutorial.estimators.compute_token_kl`        8
``"gae"``                 :func:`kltutorial.exact.placement.gae_advantages`     9
``"sequence_k1"``         :func:`kltutorial.monitoring.sequence_k1_k3`, k1      3
``"token_mean_kl"``       :func:`.sum_to_token_mean` of the masked sum          6
``"optimal_policy"``      :func:`kltutorial.exact.optimum.optimal_policy`       1
``"trajectory_step"``     :func:`kltutorial.studies.dynamics.trajectory_step`   10
``"best_of_n_kl_bound"``  :func:`kltutorial.exact.best_of_n_kl_bound`           11
``"exact_kl"``            :func:`kltutorial.exact_kl`                           12
``"distinct_2"``          :func:`kltutorial.textrlhf.distinct_n`, n = 2         11b
========================  ====================================================  =======

A new checker is one function that returns its cases, registered with :func:`register_checker`
under the exercise's name, the package function it compares against and the section; its test
(``tests/test_exercises.py``) shows that the package's implementation passes and that at least two
plausible wrong answers fail.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .estimators import k3 as _k3
from .exact.categorical import kl_divergence as _kl_divergence
from .exact.optimum import best_of_n_kl_bound as _best_of_n_kl_bound
from .exact.optimum import optimal_policy as _optimal_policy
from .logprobs import exact_kl as _exact_kl
from .objective import shape_rewards as _shape_rewards
from .studies.dynamics import trajectory_step as _trajectory_step

__all__ = ["Case", "Checker", "Verdict", "CHECKERS", "register_checker", "verdict", "check"]

WIDTH = 88  # the book's code column: every printed line fits it

Status = Literal["correct", "wrong", "error", "not implemented"]


@dataclass(frozen=True)
class Case:
    """One hidden input of a checker.

    Attributes
    ----------
    label : str
        What the case tests, shown when it fails ("small log-ratios, float64").
    args : Mapping[str, object]
        The arguments, by the name shown on failure; the function is called with them in order,
        positionally, so the reader's parameters may have other names.
    rtol, atol : float
        The agreement asked of the reader's output, elementwise:
        ``|got - expected| <= atol + rtol * |expected|``; infinities must match exactly.
    """

    label: str
    args: Mapping[str, object]
    rtol: float = 1e-9
    atol: float = 0.0


@dataclass(frozen=True)
class Checker:
    """A code exercise's checker: the package function it compares with, and its hidden cases.

    Attributes
    ----------
    name : str
        The name the notebook passes to :func:`check`.
    reference : callable
        The package's implementation, called with the same arguments as the reader's function.
    cases : callable
        Returns the cases, freshly built (called once for the reference, once for the reader).
    section : str
        The notebook of the exercise, e.g. ``"04-estimating-kl"``.
    """

    name: str
    reference: Callable[..., object]
    cases: Callable[[], Sequence[Case]]
    section: str


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` prints, as a value.

    Attributes
    ----------
    name : str
        The checker.
    status : {"correct", "wrong", "error", "not implemented"}
        ``"wrong"``: an output differs; ``"error"``: the function raised (other than
        ``NotImplementedError``).
    message : str
        The printed text.
    case : int or None
        The failing case, counted from 1; ``None`` when correct or not implemented.
    """

    name: str
    status: Status
    message: str
    case: int | None = None

    @property
    def correct(self) -> bool:
        return self.status == "correct"


CHECKERS: dict[str, Checker] = {}


def register_checker(name: str, reference: Callable[..., object], section: str
                     ) -> Callable[[Callable[[], Sequence[Case]]], Callable[[], Sequence[Case]]]:
    """Register the decorated function, which returns the cases, as the checker ``name``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if not callable(reference):
        raise TypeError(f"reference must be the package's function, got {type(reference).__name__}")

    def decorator(cases: Callable[[], Sequence[Case]]) -> Callable[[], Sequence[Case]]:
        if name in CHECKERS:
            raise ValueError(f"a checker named {name!r} is already registered")
        CHECKERS[name] = Checker(name=name, reference=reference, cases=cases, section=section)
        return cases

    return decorator


# ----------------------------------------------------------------------------------------------------
# Running a checker


def _lookup(name: object, fn: object) -> Checker:
    if not isinstance(name, str):
        raise TypeError(f"name must be the exercise's checker name as a string, got {type(name).__name__}")
    if name not in CHECKERS:
        known = ", ".join(repr(n) for n in sorted(CHECKERS))
        raise ValueError(f"no exercise checker named {name!r}; the checkers are {known}")
    if not callable(fn):
        raise TypeError(f"fn must be the function you wrote (a callable), got {type(fn).__name__}")
    return CHECKERS[name]


def verdict(name: str, fn: Callable[..., object]) -> Verdict:
    """Run the checker ``name`` on ``fn`` and return the result (what :func:`check` prints).

    Raises
    ------
    ValueError
        ``name`` is not a registered checker (the message lists them).
    TypeError
        ``name`` is not a string, or ``fn`` is not callable.
    """
    checker = _lookup(name, fn)
    expected_cases, cases = checker.cases(), checker.cases()
    total = len(cases)
    for index, (reference_case, case) in enumerate(zip(expected_cases, cases, strict=True), start=1):
        expected = checker.reference(*reference_case.args.values())
        shown = {k: _copy(v) for k, v in case.args.items()}  # as given, before the call
        header = f"{name}: {{}} on hidden case {index} of {total} ({case.label})"
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                got = fn(*case.args.values())
        except NotImplementedError:
            return Verdict(name, "not implemented",
                           f"{name}: not implemented yet (replace the stub's `raise NotImplementedError`)")
        except Exception as exc:  # noqa: BLE001 (the reader's code may raise anything: report it)
            lines = [_wrap(header.format(f"raised {type(exc).__name__}")), *_args_lines(shown),
                     _wrap(f"  {type(exc).__name__}: {exc}")]
            return Verdict(name, "error", "\n".join(lines), index)
        problem = _difference(expected, got, case.rtol, case.atol)
        if problem is not None:
            lines = [_wrap(header.format("wrong")), *_args_lines(shown),
                     _wrap(f"  expected {_show(expected)}"), _wrap(f"  got      {_show(got)}"),
                     _wrap(f"  {problem}")]
            return Verdict(name, "wrong", "\n".join(lines), index)
    return Verdict(name, "correct", f"{name}: correct (all {total} hidden cases)")


def check(name: str, fn: Callable[..., object]) -> None:
    """Check the reader's ``fn`` against the package on the hidden cases of ``name``, and print the result.

    Prints ``<name>: correct (...)``, ``<name>: not implemented yet (...)`` for a stub that raises
    ``NotImplementedError``, or the first failing case with its input, the expected and the actual
    output. Bad arguments raise as :func:`verdict` does.

    Examples
    --------
    >>> import torch
    >>> check("k3", lambda log_ratio: torch.expm1(-log_ratio) + log_ratio)
    k3: correct (all 5 hidden cases)
    >>> def my_k3(log_ratio):
    ...     raise NotImplementedError
    >>> check("k3", my_k3)
    k3: not implemented yet (replace the stub's `raise NotImplementedError`)
    """
    print(verdict(name, fn).message)


# ----------------------------------------------------------------------------------------------------
# Comparing and showing values


def _copy(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def _as_float64(value: object) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    return isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim == 0 and value.dtype != torch.bool


def _difference(expected: object, got: object, rtol: float, atol: float) -> str | None:
    """Why ``got`` does not match ``expected``, or ``None`` when it does."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a torch.Tensor of shape {tuple(expected.shape)}, got {type(got).__name__}"
        if got.shape != expected.shape:
            return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
        if got.is_complex() or got.dtype == torch.bool:
            return f"expected real numbers, got dtype {got.dtype}"
    elif not _is_number(got):
        return f"expected one number, got {type(got).__name__}"
    want, have = _as_float64(expected), _as_float64(got)
    with np.errstate(invalid="ignore"):
        close = np.isclose(have, want, rtol=rtol, atol=atol) | ((have == want) & np.isinf(want))
    if bool(np.all(close)):
        return None
    first = tuple(int(i) for i in np.argwhere(~np.atleast_1d(close))[0])
    where = f"at index {first[0] if len(first) == 1 else first}: "
    w, h = np.atleast_1d(want)[first], np.atleast_1d(have)[first]
    tolerance = ", ".join(f"{kind} {t:g}" for t, kind in ((rtol, "rtol"), (atol, "atol")) if t)
    lead = f"first difference {where}" if want.ndim else "to 10 digits: "
    return f"{lead}expected {w:.10g}, got {h:.10g} (tolerance {tolerance})"


def _number(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x + 0.0:.6g}"  # + 0.0: a negative zero shows as 0


def _show(value: object) -> str:
    """A value as a reader would write it: numbers to 6 significant digits, nested lists, the dtype."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if value.is_floating_point():
            return f"tensor({_nested(value.detach().to(torch.float64).tolist())}, {dtype})"
        return f"tensor({value.detach().tolist()}, {dtype})"
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return f"array({_nested(value.tolist())})"
        return f"array({value.tolist()})"
    if _is_number(value):
        return _number(float(value))  # type: ignore[arg-type]
    return repr(value)


def _nested(values: object) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v) for v in values) + "]"
    return _number(float(values))  # type: ignore[arg-type]


def _args_lines(args: Mapping[str, object]) -> list[str]:
    return [_wrap(f"  {key} = {_show(value)}") for key, value in args.items()]


def _wrap(line: str) -> str:
    """``line`` in lines of at most :data:`WIDTH` characters, the continuations indented."""
    return "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent="      ", break_on_hyphens=False))


# ----------------------------------------------------------------------------------------------------
# The checkers, one per code exercise


@register_checker("kl_divergence", _kl_divergence, "02-kl-divergence")
def _kl_divergence_cases() -> list[Case]:
    """``my_kl(p, q)``: KL(p || q) in nats of two probability vectors (NumPy), with the conventions
    0 log(0/q) = 0 and p log(p/0) = inf."""
    def pair(p: list[float], q: list[float]) -> dict[str, np.ndarray]:
        return {"p": np.array(p), "q": np.array(q)}

    return [
        Case("two distributions with full support", pair([0.5, 0.5], [0.25, 0.75]), atol=1e-12),
        Case("three outcomes, p far from q", pair([0.7, 0.2, 0.1], [0.1, 0.3, 0.6]), atol=1e-12),
        Case("p never produces the last outcome: 0 log(0/q) = 0", pair([0.6, 0.4, 0.0], [0.3, 0.3, 0.4]),
             atol=1e-12),
        Case("q misses an outcome p can produce: the KL is infinite",
             pair([0.5, 0.5, 0.0], [1.0, 0.0, 0.0]), atol=1e-12),
        Case("p equal to q", pair([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]), atol=1e-12),
        Case("tiny probabilities", pair([1 - 1e-12, 1e-12], [0.5, 0.5]), atol=1e-12),
    ]


@register_checker("k3", _k3, "04-estimating-kl")
def _k3_cases() -> list[Case]:
    """``my_k3(log_ratio)``: k3 = exp(-log_ratio) - 1 + log_ratio, elementwise, accurate for tiny and for
    large log-ratios."""
    def t(values: list, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {"log_ratio": torch.tensor(values, dtype=dtype)}

    return [
        Case("log-ratios of order one, float64", t([-2.0, -0.5, 0.0, 0.5, 2.0], torch.float64), atol=1e-15),
        Case("tiny log-ratios, float64: are the digits kept?", t([1e-5, -1e-5, 1e-7, -3e-8], torch.float64),
             rtol=1e-6),
        Case("small log-ratios, float32", t([1e-3, -1e-3, 3e-4], torch.float32), rtol=2e-3),
        Case("large log-ratios, float32 (exp(-120) underflows)", t([120.0, 30.0, -20.0], torch.float32),
             rtol=1e-5),
        Case("a (2, 3) batch, float64", t([[0.1, -0.1, 1.0], [3.0, -3.0, 0.0]], torch.float64),
             atol=1e-15),
    ]


@register_checker("shape_rewards", _shape_rewards, "05-penalised-objective")
def _shape_rewards_cases() -> list[Case]:
    """``my_shape_rewards(scores, per_token_kl, mask, beta)``: -beta kl_t at valid tokens, the score added at
    the last valid token, exactly 0 at padding (which may be on either side). The per-token KL is not 0
    at padding: whatever the two models say there."""
    def batch(scores: list[float], kl: list[list[float]], mask: list[list[int]], beta: float) -> dict:
        return {"scores": torch.tensor(scores, dtype=torch.float64),
                "per_token_kl": torch.tensor(kl, dtype=torch.float64),
                "mask": torch.tensor(mask), "beta": beta}

    return [
        Case("no padding, beta = 0.5",
             batch([1.0, 2.0], [[0.1, 0.2, 0.3], [0.0, -0.2, 0.5]], [[1, 1, 1], [1, 1, 1]], 0.5),
             atol=1e-12),
        Case("one right-padded, one left-padded response, beta = 0.1",
             batch([0.5, -1.0], [[0.2, -0.1, 0.4, 1.5], [2.0, -0.7, 0.3, 0.1]],
                   [[1, 1, 1, 0], [0, 0, 1, 1]], 0.1), atol=1e-12),
        Case("one-token responses at either end, beta = 0.05",
             batch([3.0, -2.0], [[0.4, 0.9, -1.2], [0.6, 0.8, 0.2]], [[1, 0, 0], [0, 0, 1]], 0.05),
             atol=1e-12),
        Case("three responses of different lengths, beta = 0.2",
             batch([1.0, 0.0, -0.5], [[0.3, 0.1, 0.7, 0.2, 0.9], [0.2, 0.2, 0.2, 0.2, 0.2],
                                       [1.1, -0.4, 0.6, 0.05, 0.3]],
                   [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], 0.2), atol=1e-12),
    ]


# ----------------------------------------------------------------------------------------------------
# Sections 3, 6 and 1 (appended as one block)


def _sequence_k1_reference(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor,
                           mask: torch.Tensor) -> torch.Tensor:
    """The per-response sum of the sampled tokens' log-ratios over the valid positions, (B,), float64:
    :func:`kltutorial.monitoring.sequence_k1_k3`'s k1."""
    from .monitoring import sequence_k1_k3

    return sequence_k1_k3(policy_logprobs - reference_logprobs, mask.bool())[0]


@register_checker("sequence_k1", _sequence_k1_reference, "03-kl-for-sequences")
def _sequence_k1_cases() -> list[Case]:
    """``my_sequence_k1(policy_logprobs, reference_logprobs, mask)``: for each response of a padded batch,
    the sum over its valid tokens of log pi(y_t | y_<t) - log pi_ref(y_t | y_<t), the one-sample estimate
    of the sequence KL. Padding (mask 0, on either side) holds whatever the models said there, even
    -inf, and must not count."""
    def batch(logp: list[list[float]], ref: list[list[float]], mask: list[list[int]]) -> dict:
        return {"policy_logprobs": torch.tensor(logp, dtype=torch.float64),
                "reference_logprobs": torch.tensor(ref, dtype=torch.float64),
                "mask": torch.tensor(mask)}

    inf = float("inf")
    return [
        Case("no padding",
             batch([[-0.5, -1.2, -0.1], [-2.0, -0.3, -0.7]], [[-0.9, -1.0, -0.4], [-1.5, -0.3, -1.1]],
                   [[1, 1, 1], [1, 1, 1]]), atol=1e-12),
        Case("one right-padded and one left-padded response",
             batch([[-0.2, -0.8, -1.5, -0.4], [-3.0, -0.6, -0.9, -0.2]],
                   [[-0.7, -0.5, -0.6, -2.2], [-0.1, -1.9, -1.4, -0.3]],
                   [[1, 1, 1, 0], [0, 0, 1, 1]]), atol=1e-12),
        Case("responses of different lengths, float32",
             {"policy_logprobs": torch.tensor([[-0.3, -0.4, -0.5, -0.6], [-1.0, -2.0, -0.5, -0.25]]),
              "reference_logprobs": torch.tensor([[-0.6, -0.2, -0.9, -0.1], [-1.5, -1.0, -0.75, -3.0]]),
              "mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])}, rtol=1e-5, atol=1e-6),
        Case("padding where a model says -inf (a token it cannot produce)",
             batch([[-0.4, -0.9, -inf], [-inf, -0.2, -1.3]], [[-0.6, -0.3, -inf], [-2.0, -0.7, -0.5]],
                   [[1, 1, 0], [0, 1, 1]]), atol=1e-12),
    ]


def _token_mean_kl_reference(per_token_kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each response's KL as a token mean over its mask, (B,), float64: the masked sum per response, then
    :func:`kltutorial.studies.beta_scale.sum_to_token_mean` with the response's length."""
    from .studies.beta_scale import sum_to_token_mean

    valid = mask.bool()
    sums = torch.where(valid, per_token_kl.to(torch.float64), 0.0).sum(dim=-1)
    means = sum_to_token_mean(sums.numpy(), valid.sum(dim=-1).numpy())
    return torch.as_tensor(np.asarray(means, dtype=np.float64)).reshape(sums.shape)


@register_checker("token_mean_kl", _token_mean_kl_reference, "06-choosing-beta")
def _token_mean_kl_cases() -> list[Case]:
    """``my_token_mean_kl(per_token_kl, mask)``: for each response of a padded batch, the mean of its
    per-token KL over its own tokens (mask 1), S_i / T_i, the reading verl and OpenRLHF give their
    controller. Padding may be on either side and holds whatever the models said there, even nan."""
    def batch(kl: list[list[float]], mask: list[list[int]]) -> dict:
        return {"per_token_kl": torch.tensor(kl, dtype=torch.float64), "mask": torch.tensor(mask)}

    nan = float("nan")
    return [
        Case("no padding", batch([[0.2, 0.4, 0.6], [0.1, -0.3, 0.5]], [[1, 1, 1], [1, 1, 1]]),
             atol=1e-12),
        Case("one right-padded and one left-padded response",
             batch([[0.3, 0.1, 0.8, 2.0], [1.5, -0.4, 0.2, 0.6]], [[1, 1, 1, 0], [0, 0, 1, 1]]),
             atol=1e-12),
        Case("responses of 1, 3 and 5 tokens, float32",
             {"per_token_kl": torch.tensor([[0.5, 0.25, 0.75, 1.0, 0.125], [0.2, 0.4, 0.9, 0.1, 0.3],
                                            [0.05, 0.15, 0.25, 0.35, 0.45]]),
              "mask": torch.tensor([[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])},
             rtol=1e-5, atol=1e-6),
        Case("padding where the models' numbers are nan",
             batch([[0.4, 0.2, nan], [nan, nan, 0.9]], [[1, 1, 0], [0, 0, 1]]), atol=1e-12),
    ]


@register_checker("optimal_policy", _optimal_policy, "01-why-kl")
def _optimal_policy_cases() -> list[Case]:
    """``my_optimal_policy(ref_logprobs, reward, beta)``: the log-probabilities of
    pi*_beta(y) = pi_ref(y) exp(r(y) / beta) / Z_beta over a listed set of responses, exact even where
    exp(r / beta) overflows (a small beta)."""
    def space(ref: list[float], reward: list[float], beta: float) -> dict:
        return {"ref_logprobs": torch.tensor(ref, dtype=torch.float64).log(),
                "reward": torch.tensor(reward, dtype=torch.float64), "beta": beta}

    return [
        Case("three responses, beta = 1", space([0.5, 0.3, 0.2], [0.0, 1.0, -1.0], 1.0), atol=1e-12),
        Case("four responses, beta = 0.3", space([0.1, 0.2, 0.3, 0.4], [2.0, 0.5, -0.5, 1.0], 0.3),
             atol=1e-12),
        Case("beta = 0.001: exp(r / beta) overflows float64",
             space([0.6, 0.3, 0.1], [1.5, 2.0, 1.99], 1e-3), atol=1e-9),
        Case("beta = 100: close to pi_ref", space([0.25, 0.25, 0.5], [3.0, -3.0, 0.0], 100.0), atol=1e-12),
    ]


# ----------------------------------------------------------------------------------------------------
# Sections 7, 8 and 9: one Ziegler update, a masked token mean, GAE


def _ziegler_update(beta: float, kl: float, target_kl: float, n_steps: int, horizon: float) -> float:
    """One update of :class:`~kltutorial.controllers.AdaptiveKLController`: β after measuring ``kl``."""
    from .controllers import AdaptiveKLController

    return float(AdaptiveKLController(beta, target_kl, horizon).update(kl, n_steps))


def _token_mean(per_token_kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-sequence token mean of :func:`~kltutorial.estimators.compute_token_kl` (``reduction="mean"``)
    of per-token values: k1 of (values, 0) is the values themselves, exactly."""
    from .estimators import compute_token_kl

    return compute_token_kl(per_token_kl, torch.zeros_like(per_token_kl), mask, "k1", "mean")[1]


def _gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
         lam: float) -> torch.Tensor:
    """The advantages of :func:`~kltutorial.exact.placement.gae_advantages` (not the returns)."""
    from .exact.placement import gae_advantages

    return gae_advantages(rewards, values, mask, gamma, lam)[0]


@register_checker("ziegler_update", _ziegler_update, "07-adaptive-kl-control")
def _ziegler_update_cases() -> list[Case]:
    """``my_update(beta, kl, target_kl, n_steps, horizon)``: beta * max(1 + e n/H, 0.01), the error
    e = KL/target - 1 clipped to [-0.2, 0.2]; plain Python numbers in, one number out."""
    def args(beta: float, kl: float, target: float, n: int, horizon: float) -> dict:
        return {"beta": beta, "kl": kl, "target_kl": target, "n_steps": n, "horizon": horizon}

    return [
        Case("KL 10 % above target, batch 512, H = 10,000", args(0.2, 6.6, 6.0, 512, 10_000.0), rtol=1e-12),
        Case("KL on target: beta unchanged", args(0.15, 6.0, 6.0, 512, 10_000.0), rtol=1e-12),
        Case("KL far above target: the error is clipped to +0.2", args(0.3, 9.0, 6.0, 2048, 10_000.0),
             rtol=1e-12),
        Case("KL far below target: the error is clipped to -0.2", args(0.3, 1.0, 6.0, 2048, 10_000.0),
             rtol=1e-12),
        Case("KL 5 % below a target of 0.1 (verl's), batch 256, H = 1,000",
             args(0.001, 0.095, 0.1, 256, 1_000.0), rtol=1e-12),
        Case("n/H = 6 and the KL 20 % below: the factor is floored at 0.01",
             args(0.4, 4.0, 6.0, 60_000, 10_000.0), rtol=1e-12),
    ]


@register_checker("token_mean", _token_mean, "08-code-implementation")
def _token_mean_cases() -> list[Case]:
    """``my_token_mean(per_token_kl, mask)``: per sequence, the mean of the per-token values over its
    valid tokens (mask 1), whatever the values at padding; 0 for a sequence with no valid token."""
    def batch(values: list[list[float]], mask: list[list[int]]) -> dict:
        return {"per_token_kl": torch.tensor(values, dtype=torch.float64), "mask": torch.tensor(mask)}

    return [
        Case("no padding", batch([[0.2, 0.4, 0.3], [0.1, -0.2, 0.4]], [[1, 1, 1], [1, 1, 1]]), atol=1e-12),
        Case("right padding, values that are not 0 at the pads",
             batch([[0.2, 0.4, 0.3, 1.5, -2.0], [0.6, -0.1, 2.2, 0.9, 0.4]],
                   [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]), atol=1e-12),
        Case("left and right padding",
             batch([[-3.0, 0.5, 0.7, 0.2], [0.3, 0.1, 4.0, 8.0]], [[0, 1, 1, 1], [1, 1, 0, 0]]), atol=1e-12),
        Case("a float mask, three responses of lengths 4, 2, 1",
             {"per_token_kl": torch.tensor([[0.5, 0.1, 0.2, 0.6], [1.1, -0.3, 5.0, 5.0],
                                             [0.05, 9.0, 9.0, 9.0]], dtype=torch.float64),
              "mask": torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])},
             atol=1e-12),
        Case("a response with no valid token gets 0",
             batch([[0.4, 0.2, 0.6], [0.7, 0.3, -0.5]], [[1, 1, 0], [0, 0, 0]]), atol=1e-12),
    ]


@register_checker("gae", _gae, "09-kl-in-reward-or-loss")
def _gae_cases() -> list[Case]:
    """``my_gae(rewards, values, mask, gamma, lam)``: delta_t = r_t + gamma V_{t+1} - V_t and
    A_t = delta_t + gamma lam A_{t+1}, backwards from each row's last valid token, with V and A zero after
    it; right padding; A exactly 0 at padding (where rewards and values may be anything)."""
    def batch(rewards: list[list[float]], values: list[list[float]], mask: list[list[int]], gamma: float,
              lam: float) -> dict:
        return {"rewards": torch.tensor(rewards, dtype=torch.float64),
                "values": torch.tensor(values, dtype=torch.float64), "mask": torch.tensor(mask),
                "gamma": gamma, "lam": lam}

    return [
        Case("the section's hand-checked case: lam = 0.5",
             batch([[0.0, 0.0, 1.0]], [[0.5, 0.6, 0.7]], [[1, 1, 1]], 1.0, 0.5), atol=1e-12),
        Case("lam = 1: the return to go minus the value",
             batch([[-0.1, -0.2, 0.9]], [[0.2, 0.4, 0.3]], [[1, 1, 1]], 1.0, 1.0), atol=1e-12),
        Case("right padding with rewards and values at the pads, lam = 0.95",
             batch([[-0.05, 0.02, 1.2, -0.3, -0.4], [0.1, 0.8, -0.7, 0.2, 0.6]],
                   [[0.4, 0.5, 0.6, 0.9, 1.1], [0.3, 0.2, 0.5, 0.4, 0.7]],
                   [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], 1.0, 0.95), atol=1e-12),
        Case("gamma = 0.9, lam = 0.8, rows of lengths 4 and 1",
             batch([[0.1, -0.2, 0.3, 1.0], [0.7, 0.5, -0.5, 0.9]],
                   [[0.2, 0.3, 0.1, 0.4], [0.6, 0.8, 0.2, 0.3]],
                   [[1, 1, 1, 1], [1, 0, 0, 0]], 0.9, 0.8), atol=1e-12),
    ]


# ----------------------------------------------------------------------------------------------------
# Sections 10, 11 and 12 (one step of model 1; best-of-n's KL bound; exact KL from logits)


@register_checker("exact_kl", _exact_kl, "12-diagnostics")
def _exact_kl_cases() -> list[Case]:
    """``my_exact_kl(policy_logits, reference_logits)``: KL(softmax(z) || softmax(w)) summed over the last
    (vocabulary) axis, one value per position; 0 log 0 = 0 for a token impossible under the policy
    (logit -inf), inf where the policy can produce a token the reference cannot, finite at large logits."""
    inf = float("inf")

    def pair(z: list, w: list, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        return {"policy_logits": torch.tensor(z, dtype=dtype),
                "reference_logits": torch.tensor(w, dtype=dtype)}

    return [
        Case("one position, logits of order one", pair([[0.0, 1.0, 2.0]], [[0.5, 0.5, 1.0]]), atol=1e-12),
        Case("a (2, 3, 4) batch of positions",
             pair([[[0.2, -1.0, 0.5, 1.5], [0.0, 0.0, 0.0, 0.0], [3.0, -2.0, 1.0, 0.0]],
                   [[1.0, 1.0, -1.0, 0.0], [2.0, -0.5, 0.3, 0.1], [0.0, 0.0, 0.0, 0.0]]],
                  [[[0.0, 0.5, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, -3.0]],
                   [[-1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.4, -0.4, 2.0, 1.0]]]),
             atol=1e-12),
        Case("a token impossible under both models (logit -inf): it adds 0, not nan",
             pair([[0.0, 1.0, -inf, 2.0]], [[0.5, 0.5, -inf, 1.0]]), atol=1e-12),
        Case("the policy can produce a token the reference cannot: the KL is inf",
             pair([[0.0, 1.0, 0.5, 2.0]], [[0.5, 0.5, -inf, 1.0]]), atol=1e-12),
        Case("large logits, float32: softmax underflows to exactly 0",
             pair([[1000.0, 0.0, -1000.0], [50.0, -50.0, 0.0]], [[0.0, 1000.0, -1000.0], [0.0, 0.0, 0.0]],
                  torch.float32), rtol=1e-5),
    ]


@register_checker("best_of_n_kl_bound", _best_of_n_kl_bound, "11-real-experiment")
def _best_of_n_kl_bound_cases() -> list[Case]:
    """``my_bound(n)``: log n - (n - 1)/n nats, for an int n >= 1."""
    return [Case(f"n = {n}", {"n": n}, rtol=1e-12, atol=1e-15) for n in (1, 2, 4, 16, 1000, 10**9)]


@register_checker("trajectory_step", _trajectory_step, "10-training-dynamics")
def _trajectory_step_cases() -> list[Case]:
    """``my_step(kl, beta, eps, noise_scale)``: one step of section 10's model 1,
    max(0, kl + 0.08 (18 / (1 + 8 beta) - kl) + noise_scale * eps), on numbers."""
    def step(kl: float, beta: float, eps: float, sigma: float) -> dict[str, float]:
        return {"kl": kl, "beta": beta, "eps": eps, "noise_scale": sigma}

    return [
        Case("the first step, from KL = 0, no noise, beta = 0.1", step(0.0, 0.1, 0.0, 0.08), atol=1e-12),
        Case("above the equilibrium, beta = 0.3, a positive kick", step(8.0, 0.3, 1.5, 0.08), atol=1e-12),
        Case("below it, beta = 0.01, a negative kick", step(12.0, 0.01, -0.7, 0.08), atol=1e-12),
        Case("beta = 0: the equilibrium is 18 nats", step(3.0, 0.0, 0.2, 0.5), atol=1e-12),
        Case("a kick that would take the KL below 0: the floor", step(0.1, 1.0, -5.0, 0.08), atol=1e-12),
    ]


def _distinct_2(texts: list[str]) -> float:
    """:func:`kltutorial.textrlhf.distinct_n` with n = 2 (imported here: :mod:`kltutorial.textrlhf` needs
    transformers, which the other checkers do not)."""
    from .textrlhf.metrics import distinct_n

    return distinct_n(texts, 2)


@register_checker("distinct_2", _distinct_2, "11b-real-text")
def _distinct_2_cases() -> list[Case]:
    """``my_distinct_2(texts)``: distinct pairs of consecutive words over all pairs of the texts (words as
    :func:`kltutorial.textrlhf.metrics.text_words` reads them: lower case, no punctuation marks); every
    case has at least one pair."""
    return [
        Case("one text, every pair different", {"texts": ["many hands make light work."]}, atol=1e-12),
        Case("a collapsed batch: one phrase again and again",
             {"texts": ["love love love", "love love", "love love love love"]}, atol=1e-12),
        Case("pairs are counted within each text, never across two",
             {"texts": ["a cat sat", "sat a cat"]}, atol=1e-12),
        Case("case and punctuation do not make a pair new",
             {"texts": ["The best, the best!", "the best the BEST."]}, atol=1e-12),
        Case("a text of one word has no pair", {"texts": ["love", "i love it", "it"]}, atol=1e-12),
    ]
