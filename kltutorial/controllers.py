r"""KL coefficient controllers (book sections 7 and 8).

All controllers share one interface, the one TRL, OpenRLHF and verl use, so that a controller from
those libraries can be swapped for one of these:

- ``.value`` is the current coefficient :math:`\beta`;
- ``update(kl, n_steps=1)`` takes the KL measured with that :math:`\beta` and returns the next one (the
  libraries return ``None`` and name the KL ``current``, TRL and OpenRLHF, or ``current_kl``, verl);
- ``.history`` holds what a plot needs, and ``state_dict()`` / ``load_state_dict()`` save and restore
  the state (the coefficient and the history) for a checkpoint.

The rule itself is the pure method ``next_beta``, which works elementwise on NumPy arrays, so that a
simulation over many seeds uses exactly the same code.

One vocabulary: every constructor takes the initial coefficient as ``beta``, the book's :math:`\beta`,
and a target as ``target_kl``; the proportional rule's horizon is ``horizon`` and ``update`` counts
``n_steps``. The libraries' own spellings (``init_kl_coef``, ``kl_coef``, ``target``, ``current``) and
their ``update`` returning ``None`` are in :mod:`kltutorial.compat`, whose controllers are these rules
behind the peers' signatures.

- :class:`FixedKLController`: :math:`\beta` never changes.
- :class:`AdaptiveKLController`: the proportional controller of Ziegler et al. (2019),
  ``lm-human-preferences``; TRL (up to v0.11), OpenRLHF and verl ship the same rule.
- :class:`DoublingKLController`: the band ("bang-bang") rule of section 8, "Code Implementation", of
  the Language AI Handbook's chapter "KL Divergence Penalty" (the text the book grew from),
  which doubles or halves :math:`\beta` outside a band around the target. It is *not* the rule of
  InstructGPT (Ouyang et al., 2022), which reports a fixed KL coefficient.
- :class:`ExponentialKLController`: the smooth multiplicative rule of that chapter's section 10.

Notation: :math:`k` counts updates, :math:`\mathrm{KL}^{(k)}` is the KL measured at update :math:`k`
(the argument ``kl``; the book keeps :math:`\mathrm{KL}_t` for the KL at position :math:`t` of a
response) and :math:`\beta_k` the coefficient it was measured with.

Library sources read: ``lm_human_preferences/train_policy.py``; TRL ``trl/trainer/utils.py`` and
``trl/trainer/ppo_config.py`` (v0.11.4); OpenRLHF ``openrlhf/trainer/ppo_utils/kl_controller.py`` and
``openrlhf/cli/train_ppo_ray.py`` (v0.11); verl ``verl/trainer/ppo/core_algos.py`` and
``verl/trainer/config/algorithm.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import (
    check_coef,
    check_greater,
    check_nonnegative_int,
    check_positive,
    check_real,
)

__all__ = [
    "MIN_FACTOR",
    "ControllerHistory",
    "KLController",
    "FixedKLController",
    "AdaptiveKLController",
    "DoublingKLController",
    "ExponentialKLController",
]

ArrayLike = float | np.ndarray

#: The proportional controller's factor never goes below this (see :class:`AdaptiveKLController`).
MIN_FACTOR = 0.01
_TINY, _HUGE = sys.float_info.min, sys.float_info.max  # smallest positive normal, largest finite float


@dataclass(frozen=True)
class ControllerHistory:
    """What a controller has seen and done.

    Attributes
    ----------
    kl : ndarray, shape (n,)
        The KL passed to each of the ``n`` updates (calls of ``update`` with ``n_steps >= 1``).
    beta : ndarray, shape (n + 1,)
        ``beta[0]`` is the initial coefficient; ``beta[t]`` is the coefficient in force when ``kl[t]``
        was measured, and ``beta[t + 1]`` the one ``update`` returned for it.
    """

    kl: np.ndarray
    beta: np.ndarray


class KLController:
    """Base class: the state (the current coefficient and the history), ``update`` and checkpoints.

    Subclasses set their parameters, call ``_start(beta)`` and implement :meth:`next_beta`, the pure rule.
    """

    _beta: float
    _kl_seen: list[float]
    _betas: list[float]
    # Only a fixed coefficient may be 0 (no penalty): a multiplicative rule started at 0 would stay there.
    _beta_may_be_zero = False

    def _start(self, beta: float) -> None:
        self._beta = beta
        self._kl_seen = []
        self._betas = [beta]

    @property
    def value(self) -> float:
        r"""The current coefficient :math:`\beta`.

        Settable, as the libraries' ``kl_ctl.value = ...``: the new value replaces the coefficient in
        force, also as the last entry of ``history.beta`` (the next update starts from it).

        Examples
        --------
        >>> c = AdaptiveKLController(0.2, target_kl=6.0, horizon=100)
        >>> c.value = 0.05
        >>> c.update(6.0), c.history.beta.tolist()
        (0.05, [0.05, 0.05])
        """
        return self._beta

    @value.setter
    def value(self, beta: float) -> None:
        check = check_coef if self._beta_may_be_zero else check_positive
        beta = check(beta, "value")
        low, high = self._value_range()
        if not low <= beta <= high:
            raise ValueError(f"value must lie in [min_coef, max_coef] = [{low}, {high}], got {beta}")
        self._beta = self._betas[-1] = beta

    @property
    def history(self) -> ControllerHistory:
        """KL seen by each update and the coefficients (see :class:`ControllerHistory`)."""
        return ControllerHistory(kl=np.array(self._kl_seen, dtype=float), beta=np.array(self._betas))

    def _value_range(self) -> tuple[float, float]:
        """The range a coefficient set by hand must lie in (the clamped rules narrow it to their clamp)."""
        return 0.0, _HUGE

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        """The rule: the coefficient after observing ``kl`` with ``beta`` (elementwise, no state).

        This is one update (``n_steps >= 1``); ``update`` handles ``n_steps = 0`` itself.
        """
        raise NotImplementedError

    def update(self, kl: float, n_steps: int = 1) -> float:
        """Observe the KL measured with the current coefficient; return the new coefficient.

        Parameters
        ----------
        kl : float
            The KL of the latest batch (in the units the target uses: nats per sequence or per token).
            A 0-d tensor or array is accepted.
        n_steps : int
            Number of training steps (or samples, as the libraries count) since the last update; only
            the proportional controller scales its step by it. ``0`` means nothing happened since the
            last update: the coefficient is returned unchanged and nothing is recorded.

        Returns
        -------
        float
            The new coefficient, also ``.value``.
        """
        kl = check_real(kl, "kl")
        n = check_nonnegative_int(n_steps, "n_steps")
        if n == 0:
            return self._beta
        self._beta = float(self.next_beta(self._beta, kl, n))
        self._kl_seen.append(kl)
        self._betas.append(self._beta)
        return self._beta

    def state_dict(self) -> dict[str, Any]:
        """The state to checkpoint: the coefficient and the history, as plain Python values.

        The rule's parameters (target, horizon, ...) are not state: rebuild the controller with the same
        arguments, then :meth:`load_state_dict`.

        Examples
        --------
        >>> c = AdaptiveKLController(0.5, target_kl=6.0, horizon=100)
        >>> c.update(9.0)  # error clipped to 0.2: 0.5 * (1 + 0.2 / 100)
        0.501
        >>> restored = AdaptiveKLController(0.5, target_kl=6.0, horizon=100)
        >>> restored.load_state_dict(c.state_dict())
        >>> restored.value, restored.history.kl
        (0.501, array([9.]))
        """
        return {
            "type": type(self).__name__,
            "value": self._beta,
            "kl": list(self._kl_seen),
            "beta": list(self._betas),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict` (of a controller of the same class)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping from state_dict(), got {type(state).__name__}")
        expected = {"type", "value", "kl", "beta"}
        if set(state) != expected:
            raise ValueError(f"state must have the keys {sorted(expected)}, got {sorted(state)}")
        if state["type"] != type(self).__name__:
            raise ValueError(f"state is of a {state['type']}, not of a {type(self).__name__}")
        check_beta = check_coef if self._beta_may_be_zero else check_positive
        value = check_beta(state["value"], "state['value']")
        kl = [check_real(x, f"state['kl'][{i}]") for i, x in enumerate(state["kl"])]
        betas = [check_beta(x, f"state['beta'][{i}]") for i, x in enumerate(state["beta"])]
        if len(betas) != len(kl) + 1 or betas[-1] != value:
            raise ValueError(
                "state['beta'] must hold one more coefficient than state['kl'] has KLs and end with "
                f"state['value']; got {len(betas)} coefficients, {len(kl)} KLs"
            )
        self._beta, self._kl_seen, self._betas = value, kl, betas


class FixedKLController(KLController):
    r"""A constant coefficient: :math:`\beta_{k+1} = \beta_k`.

    The same as the libraries' ``FixedKLController(kl_coef)``, whose ``update`` does nothing.

    Parameters
    ----------
    beta : float
        The coefficient, >= 0 (default 0.1).
    """

    _beta_may_be_zero = True

    def __init__(self, beta: float = 0.1) -> None:
        self._start(check_coef(beta, "beta"))

    def __repr__(self) -> str:
        return f"FixedKLController(beta={self._betas[0]!r})"

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        return np.broadcast_arrays(np.asarray(beta, dtype=float), np.asarray(kl))[0].copy()


class AdaptiveKLController(KLController):
    r"""Proportional KL controller of Ziegler et al. (2019).

    .. math::  e_k = \mathrm{clip}\!\left(\frac{\mathrm{KL}^{(k)}}{\mathrm{KL}_{\mathrm{target}}} - 1,
               -0.2,\, 0.2\right), \qquad \beta_{k+1} = \beta_k \,\max\!\left(1 + e_k \frac{n}{H},\;
               0.01\right)

    with :math:`n` the number of samples (sequences) the update's KL was measured on, which is what
    TRL, OpenRLHF, verl and lm-human-preferences all pass as ``n_steps``, and :math:`H` the horizon,
    in samples. The clip bounds each relative change by :math:`0.2\,n/H`; with TRL's defaults
    (``horizon=10000``, ``n_steps`` = batch size) :math:`\beta` moves slowly. Each update changes
    :math:`\log\beta` in proportion to the error (Ziegler et al. call it a log-space proportional
    controller), so :math:`\beta` accumulates the error over updates: on :math:`\beta` it acts as an
    integral controller. That removes any lasting offset from the target; it makes the KL overshoot
    only when the gain :math:`n/H` is high for the training run it controls. On the invented plant of
    book section 7 (``kltutorial.studies.control``) the loop overshoots once :math:`n/H` exceeds a
    critical gain of about :math:`a/4`, :math:`a` being the share of a deviation of the KL that the
    run itself removes per update (0.0089 at a target of 4 nats); below it, after a change of target,
    the KL reaches the new target from one side. (A start with :math:`\beta` far below its balance
    lets the KL run past the target even below that gain, because the clip limits how fast
    :math:`\beta` rises; book section 8.)

    Ziegler et al. (2019, section 2.2) write the factor as :math:`1 + K_\beta e_k` with a constant
    :math:`K_\beta = 0.1`. Their code, and every library after it, has :math:`n/H` instead: 0.0512 for
    the runs with a target in lm-human-preferences' ``launch.py`` (batch 512, horizon 10000).

    Parameters
    ----------
    beta : float
        Initial :math:`\beta` > 0 (default 0.2).
    target_kl : float
        Target KL > 0 (default 6 nats per sequence).
    horizon : float
        :math:`H` > 0 (default 10000).

    Notes
    -----
    **The same rule as the libraries**, ``AdaptiveKLController`` in lm-human-preferences
    (``train_policy.py``), TRL up to v0.11 (``trl/trainer/utils.py``), OpenRLHF
    (``openrlhf/trainer/ppo_utils/kl_controller.py``) and verl (``verl/trainer/ppo/core_algos.py``): all
    four compute ``value *= 1 + clip(current / target - 1, -0.2, 0.2) * n_steps / horizon``, and the
    coefficients here are bit-for-bit theirs whenever their factor is at least 0.01, i.e. whenever
    :math:`e_k\,n/H \ge -0.99` (every ``n_steps <= 4.95 * horizon``), and their :math:`\beta` a normal
    positive float.

    **Where it differs: β stays positive and finite.** Their factor :math:`1 + e_k n/H` reaches 0 at
    ``n_steps = 5 * horizon`` (with the KL 20 % or more below target) and is negative beyond, which
    makes :math:`\beta` negative: the penalty becomes a bonus for drifting from the reference. Here the
    factor is floored at ``MIN_FACTOR = 0.01``, so one update divides :math:`\beta` by at most 100, and
    :math:`\beta` is kept within the positive, finite floats. The floor keeps the rule monotone in
    ``n_steps`` and continuous, and leaves every ordinary update untouched. (The continuous-time limit
    :math:`\beta\,e^{e_k n/H}` would be smoother but would change every update, and underflows to 0.)

    **Interface.** ``update(kl, n_steps=1)`` returns the new :math:`\beta` (theirs return ``None`` and name
    the KL ``current`` or ``current_kl``: :mod:`kltutorial.compat` has their signatures) and treats
    ``n_steps=0`` as no update.
    Inputs are checked (theirs divide by a zero target or accept a NaN KL without a word).

    **Defaults.** lm-human-preferences: ``kl_coef`` 0.2, ``horizon`` 10000 episodes, no target (its
    sentiment and descriptiveness runs: 0.15 and target 6); TRL's old ``PPOConfig``: ``init_kl_coef``
    0.2, ``target`` 6, ``horizon`` 10000 (the defaults here); OpenRLHF: ``--algo.kl.init_coef`` 0.01,
    ``--algo.kl.horizon`` 10000, adaptive only when ``--algo.kl.target`` is set (no default); verl:
    ``kl_ctrl.kl_coef`` 0.001, ``target_kl`` 0.1, ``horizon`` 10000, ``type: fixed`` unless set to
    ``adaptive``.

    **What the libraries feed it.** lm-human-preferences and TRL pass the batch mean of the
    per-sequence KL sum with ``n_steps`` = batch size (TRL: times the number of processes); verl passes
    the batch mean of the per-sequence token mean with ``n_steps`` = batch size; OpenRLHF the ``kl`` of
    its training status, an average of per-sequence token means, with ``n_steps`` = rollout batch size x
    samples per prompt (its v0.11 source notes in a TODO that the adaptive controller is "incompatible
    here"). A target must be chosen in the units it will be compared with.

    References
    ----------
    D. Ziegler et al., "Fine-Tuning Language Models from Human Preferences", 2019.
    """

    def __init__(self, beta: float = 0.2, target_kl: float = 6.0, horizon: float = 10000.0) -> None:
        initial = check_positive(beta, "beta")
        self.target_kl = check_positive(target_kl, "target_kl")
        self.horizon = check_positive(horizon, "horizon")
        self._start(initial)

    def __repr__(self) -> str:
        return (
            f"AdaptiveKLController(beta={self._betas[0]!r}, target_kl={self.target_kl!r}, "
            f"horizon={self.horizon!r})"
        )

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        error = np.clip(np.asarray(kl) / self.target_kl - 1.0, -0.2, 0.2)  # e_k
        # the libraries' factor, in their order of operations, floored so that β stays positive
        factor = np.maximum(1.0 + error * n_steps / self.horizon, MIN_FACTOR)
        with np.errstate(over="ignore", under="ignore"):  # an overflow to inf is clipped just below
            return np.clip(beta * factor, _TINY, _HUGE)


class _ClampedKLController(KLController):
    """Shared checks of the rules that clamp β to ``[min_coef, max_coef]`` and have a target."""

    def _start_clamped(self, beta: object, target_kl: object, min_coef: object, max_coef: object) -> None:
        initial = check_positive(beta, "beta")
        self.min_coef = check_positive(min_coef, "min_coef")
        self.max_coef = check_positive(max_coef, "max_coef")
        if self.min_coef > self.max_coef:
            raise ValueError(f"min_coef must be <= max_coef, got {self.min_coef} > {self.max_coef}")
        if not self.min_coef <= initial <= self.max_coef:
            raise ValueError(
                f"beta must lie in [min_coef, max_coef] = [{self.min_coef}, {self.max_coef}], got {initial}"
            )
        self.target_kl = check_positive(target_kl, "target_kl")
        self._start(initial)

    def _value_range(self) -> tuple[float, float]:
        return self.min_coef, self.max_coef


class DoublingKLController(_ClampedKLController):
    r"""Band ("bang-bang") rule: double above the band, halve below it, clamp.

    .. math::  \beta_{k+1} = \mathrm{clip}\left(\begin{cases}
               f\,\beta_k & \mathrm{KL}^{(k)} > b \cdot \mathrm{KL}_{\mathrm{target}} \\
               \beta_k / f & \mathrm{KL}^{(k)} < \mathrm{KL}_{\mathrm{target}} / b \\
               \beta_k & \text{otherwise}\end{cases},\ \beta_{\min},\ \beta_{\max}\right)

    This is the rule of the handbook chapter's section 8, there labelled "InstructGPT style"; neither
    InstructGPT nor the libraries use it. Inside the band it does nothing, so :math:`\beta` stays wherever
    the last excursion left it, at a clamp if the excursion was long. It has no horizon: ``n_steps`` only
    matters as 0 (no update).

    Parameters
    ----------
    beta : float
        Initial :math:`\beta`, within ``[min_coef, max_coef]`` (default 0.1).
    target_kl : float
        Target KL, > 0 (default 6).
    factor : float
        :math:`f` > 1, the multiplicative step (2: doubling).
    band : float
        :math:`b` > 1, the half-width of the dead band as a ratio (1.5: [target/1.5, 1.5 target]).
    min_coef, max_coef : float
        The clamp :math:`[\beta_{\min}, \beta_{\max}]`, 0 < min_coef <= max_coef (the handbook's
        0.001 and 10).
    """

    def __init__(
        self,
        beta: float = 0.1,
        target_kl: float = 6.0,
        factor: float = 2.0,
        band: float = 1.5,
        min_coef: float = 1e-3,
        max_coef: float = 10.0,
    ) -> None:
        self.factor = check_greater(factor, "factor", 1.0)
        self.band = check_greater(band, "band", 1.0)
        self._start_clamped(beta, target_kl, min_coef, max_coef)

    def __repr__(self) -> str:
        return (
            f"DoublingKLController(beta={self._betas[0]!r}, target_kl={self.target_kl!r}, "
            f"factor={self.factor!r}, band={self.band!r}, min_coef={self.min_coef!r}, "
            f"max_coef={self.max_coef!r})"
        )

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        kl = np.asarray(kl)
        scale = np.where(
            kl > self.band * self.target_kl,
            self.factor,
            np.where(kl < self.target_kl / self.band, 1.0 / self.factor, 1.0),
        )
        return np.clip(beta * scale, self.min_coef, self.max_coef)


class ExponentialKLController(_ClampedKLController):
    r"""Smooth multiplicative rule of the handbook chapter's section 10.

    .. math::  \beta_{k+1} = \mathrm{clip}\left(\beta_k \exp\!\left(g\,
               \frac{\mathrm{KL}^{(k)} - \mathrm{KL}_{\mathrm{target}}}{\mathrm{KL}_{\mathrm{target}}}\right),
               \ \beta_{\min},\ \beta_{\max}\right)

    Unlike the proportional controller its error is not clipped, so a large excursion moves
    :math:`\beta` a lot in one step; the clamp bounds it. None of the libraries ships it. ``n_steps``
    only matters as 0 (no update).

    Parameters
    ----------
    beta : float
        Initial :math:`\beta`, within ``[min_coef, max_coef]`` (default 0.1).
    target_kl : float
        Target KL, > 0 (default 6).
    gain : float
        :math:`g` > 0 (the handbook uses 0.12).
    min_coef, max_coef : float
        The clamp :math:`[\beta_{\min}, \beta_{\max}]` (the handbook uses [0.02, 0.5]).
    """

    def __init__(
        self,
        beta: float = 0.1,
        target_kl: float = 6.0,
        gain: float = 0.12,
        min_coef: float = 0.02,
        max_coef: float = 0.5,
    ) -> None:
        self.gain = check_positive(gain, "gain")
        self._start_clamped(beta, target_kl, min_coef, max_coef)

    def __repr__(self) -> str:
        return (
            f"ExponentialKLController(beta={self._betas[0]!r}, target_kl={self.target_kl!r}, "
            f"gain={self.gain!r}, min_coef={self.min_coef!r}, max_coef={self.max_coef!r})"
        )

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        relative_error = (np.asarray(kl) - self.target_kl) / self.target_kl
        return np.clip(beta * np.exp(self.gain * relative_error), self.min_coef, self.max_coef)
