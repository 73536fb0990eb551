r"""KL estimators, kept in a registry (book sections 4, 8 and 9).

A sampled estimator is a function of the log-ratio of one token sampled from the policy,

.. math::  \Delta = \log \pi(y) - \log \pi_{\mathrm{ref}}(y), \qquad y \sim \pi,

whose mean over such tokens estimates
:math:`\mathrm{KL}(\pi \,\|\, \pi_{\mathrm{ref}}) = \mathbb{E}_{y\sim\pi}[\Delta]`. Adding one takes a small
function of :math:`\Delta` and one registration line, as verl's ``register_policy_loss`` does::

    @register_estimator("half_k2", aliases=("half_mse",))
    def half_k2(log_ratio):
        return 0.25 * log_ratio.square()

after which ``kl_estimate(lp, lq, "half_k2")`` and ``compute_token_kl(..., estimator="half_mse")`` use it.
The registered estimators, in the order ``for name in ESTIMATORS`` yields them:

=========  ===================  ===================================  =========================================
name       aliases              value                                property
=========  ===================  ===================================  =========================================
``k1``     ``kl``               :math:`\Delta`                       unbiased; negative for many samples
``k2``     ``mse``              :math:`\tfrac12\Delta^2`             biased (second order); >= 0
``k3``     ``low_var_kl``       :math:`e^{-\Delta}-1+\Delta`         unbiased; >= 0; low variance near pi_ref
``abs``                         :math:`|\Delta|`                     biased upwards; >= 0
``k1+``    ``kl+``              value of k1, gradient of k2          straight-through (verl)
``k2+``    ``mse+``             value and gradient of k2             the same as ``k2`` (verl's name)
``k3+``    ``low_var_kl+``      value of k3, gradient of k2          straight-through (verl)
``abs+``                        value of abs, gradient of k2         straight-through (verl)
``full``                        :math:`\sum_v p_v \log(p_v/q_v)`     exact; needs both models' logits
=========  ===================  ===================================  =========================================

The sampled estimates are only right for tokens **sampled from the policy**. Evaluated on tokens drawn
any other way (uniformly, say) the log-ratio's mean is not a KL and can be negative.

.. rubric:: What the libraries call them, and how they differ

- **Names.** TRL up to v0.11 (``PPOTrainer._kl_penalty``): ``kl``, ``abs``, ``mse``, ``full``, no k3.
  TRL's later ``PPOTrainer`` (``kl_estimator``): ``k1``, ``k3``; its ``GRPOTrainer`` always uses k3 in
  the loss. OpenRLHF (``compute_approx_kl``): ``k1``, ``k2``, ``k3``; no ``abs``, no ``full``. verl
  (``kl_penalty`` in ``verl/trainer/ppo/core_algos.py``): ``kl``/``k1``, ``abs``, ``mse``/``k2``,
  ``low_var_kl``/``k3``, any of them with a ``+`` suffix (all four here: ``k1+``, ``k2+``, ``k3+``,
  ``abs+``), and ``full``, which raises ``NotImplementedError``.
- **Clamps.** OpenRLHF clamps every estimate to [-10, 10]; verl clamps only ``low_var_kl``/``k3``, its
  log-ratio to [-20, 20] before the exponential and the estimate to [-10, 10]; TRL clamps nothing. Here
  nothing is clamped unless asked: ``clamp=10`` reproduces OpenRLHF, and ``estimator="k3", clamp=10,
  log_ratio_clamp=20`` reproduces verl's ``low_var_kl``.
- **Precision.** OpenRLHF casts both log-probs to float32 before it subtracts them; TRL and verl compute
  in the log-probs' own dtype, so bfloat16 log-probs give a bfloat16 KL. Here half-precision log-probs
  are computed in float32 (as OpenRLHF does), and float64 stays float64 (OpenRLHF casts it down).
- **k3** is computed as :math:`\mathrm{expm1}(-\Delta) + \Delta`; the libraries write
  :math:`e^{-\Delta} - 1 + \Delta`, which agrees up to rounding but loses the digits of a small
  :math:`\Delta` to cancellation.
- **Straight-through** ``+`` names are verl's: ``k2 - k2.detach() + value.detach()``, so the value is
  the estimator's (clamped, if asked) and the gradient k2's: in expectation that of
  :math:`\mathrm{KL}(\pi \| \pi_{\mathrm{ref}})` for one token, of the per-token KLs with the prefixes
  held fixed for a sequence. verl added them in its PR #2953 (August 2025, v0.6.0); up to v0.7.1
  they raised ``NotImplementedError``, because the suffix reached the dispatch unstripped; v0.8.0 and
  later strip it first (read in the releases' ``core_algos.py``).
- **Importance weight.** With the KL in the loss, PPO's and GRPO's later epochs score tokens sampled from
  an earlier policy :math:`\pi_{\mathrm{old}}`, and k2's gradient is unbiased only on-policy. OpenRLHF's
  ``compute_approx_kl(..., log_probs_old, unbiased_gradient=True)`` (PR #1309, August 2026) keeps the
  estimator's value and backpropagates :math:`w\,\Delta\,\nabla\log\pi`, with
  :math:`w = \min(\pi/\pi_{\mathrm{old}}, 10)` detached, whose mean over :math:`y \sim \pi_{\mathrm{old}}`
  is :math:`\nabla\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})` (up to the clip). Here that is a ``+`` name with
  ``old_logprobs`` (and ``weight_clamp=10``).
- **full** is :func:`~kltutorial.logprobs.exact_kl`. TRL's ``full`` (up to v0.11) is
  ``kl_div(ref_logprob, logprob, log_target=True).sum(-1)``, which is NaN wherever the policy's logit is
  ``-inf`` (:math:`0 \cdot \infty`); ``exact_kl`` uses :math:`0 \log 0 = 0` there.

References: J. Schulman, "Approximating KL Divergence" (2020); TRL ``trl/trainer/ppo_trainer.py``
(v0.11.4); OpenRLHF ``openrlhf/models/utils.py`` (v0.11); verl ``verl/trainer/ppo/core_algos.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import torch

from ._validation import (
    check_choice,
    check_logits,
    check_mask,
    check_positive,
    check_same_shape,
    check_tensor_pair,
)
from .logprobs import exact_kl_unchecked

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_ALIASES",
    "Estimator",
    "EstimatorSpec",
    "Reduction",
    "register_estimator",
    "get_estimator",
    "kl_estimate",
    "compute_token_kl",
    "k1",
    "k2",
    "k3",
    "abs_log_ratio",
    "full_kl",
]

Estimator = str  #: A registered estimator's name or alias, e.g. ``"k1"``, ``"low_var_kl"``, ``"k3+"``.
#: How :func:`compute_token_kl` reduces a sequence's per-token estimates, ``"sum"`` or ``"mean"``.
Reduction = Literal["sum", "mean"]
REDUCTIONS: tuple[str, ...] = ("sum", "mean")


# ----------------------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True)
class EstimatorSpec:
    """One registered estimator.

    Attributes
    ----------
    name : str
        The canonical name.
    fn : callable
        ``fn(log_ratio) -> Tensor`` (same shape), or, when ``needs_logits``,
        ``fn(policy_logits, reference_logits, attention_mask) -> Tensor`` of shape (B, T).
        It trusts its input: :func:`kl_estimate` and :func:`compute_token_kl` validate it first.
    aliases : tuple of str
        Other names that resolve to this one (the libraries' spellings).
    gradient_from : str or None
        If set, the estimate has this estimator's gradient and ``fn``'s value (straight-through).
    needs_logits : bool
        The estimator reads both models' logits, not the sampled tokens' log-probs.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    aliases: tuple[str, ...] = ()
    gradient_from: str | None = None
    needs_logits: bool = False


_SPECS: dict[str, EstimatorSpec] = {}
_ALIASES: dict[str, str] = {}

#: Registered estimators by canonical name, in registration order (read-only view).
#:
#: :meta hide-value:
ESTIMATORS = MappingProxyType(_SPECS)
#: Alias -> canonical name (read-only view).
ESTIMATOR_ALIASES = MappingProxyType(_ALIASES)


def _check_new_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} must be a non-empty str, got {name!r}")
    if name in _SPECS or name in _ALIASES:
        raise ValueError(f"{what} {name!r} is already registered; choose another name")
    return name


def register_estimator(
    name: str,
    *,
    aliases: Sequence[str] = (),
    gradient_from: str | None = None,
    needs_logits: bool = False,
) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """Decorator that registers ``fn`` as the estimator ``name`` (and its ``aliases``); returns ``fn``.

    Parameters
    ----------
    name : str
        New canonical name; it is appended to :data:`ESTIMATORS`.
    aliases : sequence of str
        Further new names for it.
    gradient_from : str, optional
        A registered sampled estimator whose gradient the estimate takes (straight-through).
    needs_logits : bool
        ``fn`` takes ``(policy_logits, reference_logits, attention_mask)`` instead of the log-ratio.

    Returns
    -------
    callable
        The decorator.

    Examples
    --------
    The straight-through variants are the plain functions registered once more::

        register_estimator("k3+", aliases=("low_var_kl+",), gradient_from="k2")(k3)
    """
    _check_new_name(name, "name")
    if isinstance(aliases, str) or not isinstance(aliases, Sequence):
        raise TypeError(f"aliases must be a sequence of str, got {type(aliases).__name__}")
    for alias in aliases:
        _check_new_name(alias, "alias")
    if len({name, *aliases}) != 1 + len(aliases):
        raise ValueError(f"name and aliases must all differ, got {name!r} and {tuple(aliases)!r}")
    if not isinstance(needs_logits, bool):
        raise TypeError(f"needs_logits must be a bool, got {type(needs_logits).__name__}")
    if gradient_from is not None:
        source = get_estimator(gradient_from)
        if needs_logits or source.needs_logits or source.gradient_from is not None:
            raise ValueError(
                "gradient_from must name a plain sampled estimator, and the new estimator must be sampled "
                f"too; got gradient_from={gradient_from!r} with needs_logits={needs_logits}"
            )
        gradient_from = source.name

    def decorator(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if not callable(fn):
            raise TypeError(f"register_estimator({name!r}) must decorate a function, got {type(fn).__name__}")
        _SPECS[name] = EstimatorSpec(name, fn, tuple(aliases), gradient_from, needs_logits)
        _ALIASES.update(dict.fromkeys(aliases, name))
        return fn

    return decorator


def get_estimator(name: object) -> EstimatorSpec:
    """The registered estimator called ``name`` (a canonical name or an alias).

    Examples
    --------
    >>> get_estimator("low_var_kl").name
    'k3'
    """
    if isinstance(name, str):
        if name in _SPECS:
            return _SPECS[name]
        if name in _ALIASES:
            return _SPECS[_ALIASES[name]]
    names = ", ".join(repr(n) for n in _SPECS)
    aliases = ", ".join(f"{a!r} ({c})" for a, c in _ALIASES.items())
    raise ValueError(f"estimator must be one of {names}, or an alias: {aliases}; got {name!r}")


# ----------------------------------------------------------------------------------------------------
# The estimators. Each trusts its input; kl_estimate and compute_token_kl check it.


@register_estimator("k1", aliases=("kl",))
def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    r"""k1 = :math:`\Delta`: unbiased, but negative whenever the reference likes the token better."""
    return log_ratio


@register_estimator("k2", aliases=("mse",))
def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    r"""k2 = :math:`\tfrac12 \Delta^2`: non-negative, biased by :math:`O(\mathbb{E}[\Delta^3])`.

    Its expected gradient on on-policy samples is that of :math:`\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})`
    for a one-token output; for a sequence, that of the per-token KLs with the prefixes held fixed, which is
    not the sequence KL's (book section 9).
    """
    return 0.5 * log_ratio.square()


@register_estimator("k3", aliases=("low_var_kl",))
def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    r"""k3 = :math:`(r - 1) - \log r`, :math:`r = \pi_{\mathrm{ref}}/\pi = e^{-\Delta}`: unbiased, >= 0.

    Its expected gradient on on-policy samples is that of the forward :math:`\mathrm{KL}(\pi_{\mathrm{ref}}
    \|\pi)` (per token, the prefixes held fixed, for a sequence), not of the penalised
    :math:`\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})`: hence ``k3+``.
    """
    # r - 1 - log r = expm1(-Δ) + Δ; expm1 keeps precision when Δ is small.
    return torch.expm1(-log_ratio) + log_ratio


@register_estimator("abs")
def abs_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    r"""TRL's and verl's ``abs`` = :math:`|\Delta|`: non-negative, biased upwards."""
    return log_ratio.abs()


# Straight-through (verl's "+" names): the value of each estimator, the gradient of k2 (k2+ is k2 itself).
register_estimator("k1+", aliases=("kl+",), gradient_from="k2")(k1)
register_estimator("k2+", aliases=("mse+",), gradient_from="k2")(k2)
register_estimator("k3+", aliases=("low_var_kl+",), gradient_from="k2")(k3)
register_estimator("abs+", gradient_from="k2")(abs_log_ratio)


@register_estimator("full", needs_logits=True)
def full_kl(
    policy_logits: torch.Tensor, reference_logits: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    r"""The exact per-position KL over the vocabulary, :func:`~kltutorial.logprobs.exact_kl`, shape (B, T)."""
    return exact_kl_unchecked(policy_logits, reference_logits, attention_mask)


# ----------------------------------------------------------------------------------------------------
# Checked entry points


@dataclass(frozen=True)
class KLInputs:
    """Checked arguments of one estimate: the estimator, the clamps and the tensors it reads.

    Built by :func:`kl_estimate` and :func:`compute_token_kl` after their checks, and by a caller that
    has checked the tensors itself (:func:`kltutorial.objective.compute_rlhf_objective`); nothing is
    checked again. :meth:`estimate` computes the per-token estimate.
    """

    spec: EstimatorSpec
    clamp: float | None = None
    log_ratio_clamp: float | None = None
    policy_logprobs: torch.Tensor | None = None
    reference_logprobs: torch.Tensor | None = None
    policy_logits: torch.Tensor | None = None
    reference_logits: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    weight_clamp: float | None = None

    @property
    def shape(self) -> torch.Size:
        """Shape of the per-token result."""
        if self.policy_logprobs is not None:
            return self.policy_logprobs.shape
        return self.policy_logits.shape[:-1]

    def estimate(self, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The per-token estimate, (B, T): the estimator, then the clamps, then straight-through.

        ``mask`` (boolean, (B, T)) is used only by logits-based estimators, to keep padding out of their
        backward; the caller masks the result.
        """
        return _estimate(self, mask)


def _check_inputs(
    policy_logprobs: object,
    reference_logprobs: object,
    estimator: object,
    clamp: object,
    log_ratio_clamp: object,
    policy_logits: object,
    reference_logits: object,
    old_logprobs: object = None,
    weight_clamp: object = None,
) -> KLInputs:
    """Validate the arguments that kl_estimate and compute_token_kl share."""
    spec = get_estimator(estimator)
    clamp = None if clamp is None else check_positive(clamp, "clamp")
    log_ratio_clamp = None if log_ratio_clamp is None else check_positive(log_ratio_clamp, "log_ratio_clamp")
    if (policy_logits is None) != (reference_logits is None):
        raise ValueError("pass both policy_logits and reference_logits, or neither")
    if (policy_logprobs is None) != (reference_logprobs is None):
        raise ValueError("pass both policy_logprobs and reference_logprobs, or neither")
    if spec.needs_logits and policy_logits is None:
        raise ValueError(
            f"estimator {estimator!r} needs policy_logits and reference_logits, shape (B, T, V): the exact "
            "KL sums over the whole vocabulary, which the sampled tokens' log-probs do not hold"
        )
    if not spec.needs_logits and policy_logprobs is None:
        raise ValueError(f"estimator {estimator!r} needs policy_logprobs and reference_logprobs")
    if spec.needs_logits and log_ratio_clamp is not None:
        raise ValueError(f"log_ratio_clamp applies to sampled estimators, not to {estimator!r}")
    if policy_logits is not None:
        check_logits(policy_logits, "policy_logits")
        check_logits(reference_logits, "reference_logits")
        check_same_shape(policy_logits, "policy_logits", reference_logits, "reference_logits")
    if policy_logprobs is not None:
        check_tensor_pair(policy_logprobs, "policy_logprobs", reference_logprobs, "reference_logprobs")
        if policy_logits is not None and policy_logprobs.shape != policy_logits.shape[:-1]:
            raise ValueError(
                f"policy_logprobs must have shape {tuple(policy_logits.shape[:-1])}, the logits' (B, T), "
                f"got {tuple(policy_logprobs.shape)}"
            )
    if old_logprobs is not None:
        if spec.gradient_from is None:
            raise ValueError(
                "old_logprobs importance-weights the gradient of a straight-through estimator ('k1+', "
                "'k2+', 'k3+', 'abs+'), the only ones whose gradient is k2's whatever their value; "
                f"got {estimator!r}"
            )
        check_tensor_pair(policy_logprobs, "policy_logprobs", old_logprobs, "old_logprobs")
    if weight_clamp is not None:
        if old_logprobs is None:
            raise ValueError("weight_clamp bounds the importance weight, which needs old_logprobs")
        weight_clamp = check_positive(weight_clamp, "weight_clamp")
    return KLInputs(
        spec, clamp, log_ratio_clamp, policy_logprobs, reference_logprobs, policy_logits, reference_logits,
        old_logprobs, weight_clamp,
    )


def _log_ratio(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Δ = log π - log π_ref, in float32 for half-precision inputs (as OpenRLHF), float64 if either is."""
    dtype = torch.promote_types(policy_logprobs.dtype, reference_logprobs.dtype)
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return policy_logprobs.to(dtype) - reference_logprobs.to(dtype)


def _estimate(x: KLInputs, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The per-token estimate from checked input: the estimator, then the clamps, then straight-through.

    ``mask`` (boolean, (B, T)) is used only by logits-based estimators, to keep padding out of their
    backward; the caller masks the result.
    """
    spec, clamp = x.spec, x.clamp
    if spec.needs_logits:
        value = spec.fn(x.policy_logits, x.reference_logits, mask)  # (B, T)
        return value if clamp is None else value.clamp(-clamp, clamp)
    log_ratio = _log_ratio(x.policy_logprobs, x.reference_logprobs)  # Δ
    bound = x.log_ratio_clamp
    value = spec.fn(log_ratio if bound is None else log_ratio.clamp(-bound, bound))
    if clamp is not None:
        value = value.clamp(-clamp, clamp)
    if spec.gradient_from is not None:
        # straight-through, in verl's form: adds exactly 0 to the value, and the gradient of k2(Δ)
        surrogate = _SPECS[spec.gradient_from].fn(log_ratio)
        if x.old_logprobs is not None:
            # off-policy: times w = π/π_old, detached (OpenRLHF's unbiased_gradient), so that the gradient
            # w Δ ∇log π has the mean ∇KL(π || π_ref) over tokens sampled from π_old
            w = _log_ratio(x.policy_logprobs, x.old_logprobs).detach().exp()
            surrogate = surrogate * (w if x.weight_clamp is None else w.clamp(max=x.weight_clamp))
        value = surrogate - surrogate.detach() + value.detach()
    return value


def kl_estimate(
    policy_logprobs: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    estimator: Estimator = "k1",
    *,
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
    policy_logits: torch.Tensor | None = None,
    reference_logits: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    weight_clamp: float | None = None,
) -> torch.Tensor:
    r"""Per-token estimate of KL(pi || pi_ref) from the log-ratio of tokens sampled from pi.

    With :math:`\Delta = \log\pi(y) - \log\pi_{\mathrm{ref}}(y)`:
    ``k1`` = :math:`\Delta`, ``k2`` = :math:`\tfrac12\Delta^2`,
    ``k3`` = :math:`e^{-\Delta} - 1 + \Delta`, ``abs`` = :math:`|\Delta|`; then, if asked,
    :math:`\mathrm{clip}(\cdot, -c, c)` with ``c = clamp``. See the module docstring for every name
    and for how TRL, OpenRLHF and verl differ.

    Parameters
    ----------
    policy_logprobs : Tensor, any shape
        :math:`\log\pi(y)` of tokens ``y`` sampled from the policy. Not needed by ``"full"``.
    reference_logprobs : Tensor, same shape
        :math:`\log\pi_{\mathrm{ref}}(y)` of the same tokens.
    estimator : str
        A name or alias in :data:`ESTIMATORS` / :data:`ESTIMATOR_ALIASES` (``"k1"``, ``"low_var_kl"``,
        ``"k3+"``, ``"full"``, ...).
    clamp : float, optional
        Clip each estimate to ``[-clamp, clamp]`` (OpenRLHF and verl use 10). Its gradient is 0 where
        it clips, except for the straight-through names, whose gradient is always k2's. Default: none.
    log_ratio_clamp : float, optional
        Clip :math:`\Delta` to ``[-log_ratio_clamp, log_ratio_clamp]`` before the estimator (verl uses 20
        for k3, so that :math:`e^{-\Delta}` cannot overflow into an infinite value or a NaN gradient).
    policy_logits, reference_logits : Tensor, shape (B, T, V), optional
        Both models' logits; needed by ``"full"`` and ignored by the sampled estimators (so a loop over
        :data:`ESTIMATORS` can pass them to every call). The log-probs, if given, must have shape (B, T).
    old_logprobs : Tensor, same shape as the log-probs, optional
        :math:`\log\pi_{\mathrm{old}}(y)` under the policy that sampled the tokens, when that is an earlier
        policy than the one being trained (PPO's and GRPO's later epochs, with the KL in the loss). Only
        with a straight-through (``+``) estimator: its value is unchanged and its gradient becomes
        :math:`w\,\Delta\,\nabla\log\pi(y)`, :math:`w = \pi(y)/\pi_{\mathrm{old}}(y)` (detached), whose
        mean over :math:`y\sim\pi_{\mathrm{old}}` is :math:`\nabla\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})`.
        Without it the ``+`` gradient is that of :math:`w = 1`, unbiased only for tokens sampled from pi.
    weight_clamp : float, optional
        Upper bound on :math:`w` (OpenRLHF uses 10): bounded variance, at the price of a bias where it
        clips. Needs ``old_logprobs``.

    Returns
    -------
    Tensor, same shape as the log-probs ((B, T) for ``"full"``)
        One estimate per token, in float32 for half-precision input. Averaged over samples from pi,
        ``k1`` and ``k3`` converge to the exact KL; ``k2`` to it plus a bias of order
        :math:`\mathbb{E}[\Delta^3]`.

    Examples
    --------
    >>> d = torch.tensor([0.5, -0.5])
    >>> kl_estimate(d, torch.zeros(2), "k3")  # exp(-0.5) - 1 + 0.5, exp(0.5) - 1 - 0.5
    tensor([0.1065, 0.1487])
    >>> kl_estimate(torch.tensor([-30.0]), torch.zeros(1), "low_var_kl", clamp=10, log_ratio_clamp=20)
    tensor([10.])

    Off-policy, the gradient of a ``+`` estimate is importance-weighted; its value is not:

    >>> lp = torch.tensor([-1.0], requires_grad=True)
    >>> old = lp.detach() - torch.tensor(2.0).log()  # pi_old(y) = pi(y) / 2
    >>> kl = kl_estimate(lp, torch.tensor([-1.5]), "k3+", old_logprobs=old)
    >>> kl.backward()
    >>> kl.detach(), lp.grad  # k3(0.5); w Δ = 2 * 0.5
    (tensor([0.1065]), tensor([1.]))
    """
    inputs = _check_inputs(
        policy_logprobs, reference_logprobs, estimator, clamp, log_ratio_clamp,
        policy_logits, reference_logits, old_logprobs, weight_clamp,
    )
    return _estimate(inputs)


def compute_token_kl(
    policy_logprobs: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    estimator: Estimator = "k1",
    reduction: Reduction = "sum",
    *,
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
    policy_logits: torch.Tensor | None = None,
    reference_logits: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    weight_clamp: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-token KL estimates and their per-sequence reduction, padding excluded.

    .. math::  \mathrm{kl}_t = m_t \, k(\Delta_t), \qquad
               \mathrm{KL}_{\mathrm{seq}} = \sum_t \mathrm{kl}_t \;\; (\text{"sum"}) \quad\text{or}\quad
               \frac{\sum_t \mathrm{kl}_t}{\sum_t m_t} \;\; (\text{"mean"})

    The sum estimates the sequence-level KL (the chain rule makes it the sum of per-token KLs); this is
    what lm-human-preferences and TRL feed their KL controllers. The token mean is what verl's
    ``apply_kl_penalty`` and OpenRLHF's experience maker compute per sequence (and then average over the
    batch). A target of 6 nats means very different things under the two, so the choice is explicit.

    Parameters
    ----------
    policy_logprobs : Tensor, shape (B, T)
        Log-probs under the policy of tokens sampled from the policy (not needed by ``"full"``).
    reference_logprobs : Tensor, shape (B, T)
        Log-probs of the same tokens under the reference model.
    attention_mask : Tensor, shape (B, T), optional
        1 for response tokens, 0 for padding; masked positions contribute exactly 0, whatever the
        estimate there (even ``inf``). ``None`` means every position is valid.
    estimator : str
        Per-token estimator, a name or alias in :data:`ESTIMATORS`, see :func:`kl_estimate`.
    reduction : {"sum", "mean"}
        ``"sum"`` over valid tokens, or ``"mean"`` over valid tokens (a sequence with no valid token
        gets 0).
    clamp, log_ratio_clamp : float, optional
        As in :func:`kl_estimate`.
    policy_logits, reference_logits : Tensor, shape (B, T, V), optional
        As in :func:`kl_estimate`; needed by ``"full"``.
    old_logprobs : Tensor, shape (B, T), optional
        Log-probs of the same tokens under the policy that sampled them, to importance-weight the gradient
        of a ``+`` estimator, as in :func:`kl_estimate`.
    weight_clamp : float, optional
        Upper bound on the importance weight, as in :func:`kl_estimate`.

    Returns
    -------
    per_token : Tensor, shape (B, T)
        Masked per-token estimates.
    per_sequence : Tensor, shape (B,)
        Their sum or token mean per sequence.

    Examples
    --------
    >>> lp = torch.tensor([[-1.0, -1.0, -1.0]])
    >>> lq = torch.tensor([[-2.0, -1.5, -9.0]])
    >>> compute_token_kl(lp, lq, torch.tensor([[1, 1, 0]]))  # k1: 1 + 0.5, the padded 8 left out
    (tensor([[1.0000, 0.5000, 0.0000]]), tensor([1.5000]))
    """
    inputs = _check_inputs(
        policy_logprobs, reference_logprobs, estimator, clamp, log_ratio_clamp,
        policy_logits, reference_logits, old_logprobs, weight_clamp,
    )
    if len(inputs.shape) != 2:  # logits are always (B, T, V), so these are the log-probs
        raise ValueError(f"policy_logprobs must have shape (B, T), got {tuple(inputs.shape)}")
    check_choice(reduction, "reduction", REDUCTIONS)
    mask = None if attention_mask is None else check_mask(attention_mask, "attention_mask", inputs.shape)
    per_token = _estimate(inputs, mask)
    if mask is None:
        mask = torch.ones_like(per_token, dtype=torch.bool)
    # torch.where, not multiplication: 0 * inf would be NaN for a padded position.
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    per_sequence = per_token.sum(dim=-1)
    if reduction == "mean":
        n_valid = mask.sum(dim=-1).clamp(min=1).to(per_sequence.dtype)
        per_sequence = per_sequence / n_valid
    return per_token, per_sequence

