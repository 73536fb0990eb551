"""KL coefficient controllers (book sections 7 and 8).

All controllers share one interface: ``.value`` is the current coefficient :math:`\\beta`,
``update(current_kl, n_steps=1)`` takes the KL measured with that :math:`\\beta` and returns the next one,
and ``.history`` holds what a plot needs. The rule itself is the pure method ``next_beta``, which works
elementwise on NumPy arrays, so that a simulation over many seeds uses exactly the same code.

- :class:`FixedKLController`: :math:`\\beta` never changes.
- :class:`AdaptiveKLController`: the proportional controller of Ziegler et al. (2019),
  ``lm-human-preferences``; TRL (up to v0.11), OpenRLHF and verl ship the same rule.
- :class:`DoublingKLController`: the band ("bang-bang") rule of the source handbook's section 8,
  which doubles or halves :math:`\\beta` outside a band around the target. It is *not* the rule of
  InstructGPT (Ouyang et al., 2022), which reports a fixed KL coefficient.
- :class:`ExponentialKLController`: the smooth multiplicative rule of the handbook's section 10.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validation import check_coef, check_positive, check_positive_int

__all__ = [
    "ControllerHistory",
    "KLController",
    "FixedKLController",
    "AdaptiveKLController",
    "DoublingKLController",
    "ExponentialKLController",
]

ArrayLike = float | np.ndarray


@dataclass(frozen=True)
class ControllerHistory:
    """What a controller has seen and done.

    Attributes
    ----------
    kl : ndarray, shape (n,)
        The KL passed to each of the ``n`` calls of ``update``.
    beta : ndarray, shape (n + 1,)
        ``beta[0]`` is the initial coefficient; ``beta[t]`` is the coefficient in force when ``kl[t]``
        was measured, and ``beta[t + 1]`` the one ``update`` returned for it.
    """

    kl: np.ndarray
    beta: np.ndarray


def _check_kl(current_kl: object) -> float:
    if hasattr(current_kl, "item") and getattr(current_kl, "ndim", None) == 0:
        current_kl = current_kl.item()  # a 0-d torch tensor or NumPy array
    if isinstance(current_kl, bool) or not isinstance(current_kl, (int, float, np.integer, np.floating)):
        raise TypeError(f"current_kl must be a real number, got {type(current_kl).__name__}")
    v = float(current_kl)
    if not np.isfinite(v):
        raise ValueError(f"current_kl must be finite, got {v}")
    return v


def _check_clamp(init_kl_coef: object, min_coef: object, max_coef: object) -> tuple[float, float, float]:
    """Validate a clamped rule's initial coefficient and its clamp ``[min_coef, max_coef]``."""
    init = check_positive(init_kl_coef, "init_kl_coef")
    lo = check_positive(min_coef, "min_coef")
    hi = check_positive(max_coef, "max_coef")
    if lo > hi:
        raise ValueError(f"min_coef must be <= max_coef, got {lo} > {hi}")
    if not lo <= init <= hi:
        raise ValueError(f"init_kl_coef must lie in [min_coef, max_coef] = [{lo}, {hi}], got {init}")
    return init, lo, hi


@dataclass
class KLController:
    """Base class: state (the current coefficient and the history) and the ``update`` loop.

    Subclasses implement :meth:`next_beta`, the pure rule.
    """

    _beta: float = field(init=False, repr=False)
    _kl_seen: list[float] = field(init=False, repr=False, default_factory=list)
    _betas: list[float] = field(init=False, repr=False, default_factory=list)

    def _start(self, beta: float) -> None:
        self._beta = beta
        self._kl_seen = []
        self._betas = [beta]

    @property
    def value(self) -> float:
        """The current coefficient :math:`\\beta`."""
        return self._beta

    @property
    def history(self) -> ControllerHistory:
        """KL seen by each update and the coefficients (see :class:`ControllerHistory`)."""
        return ControllerHistory(kl=np.array(self._kl_seen, dtype=float), beta=np.array(self._betas))

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        """The rule: the coefficient after observing ``kl`` with ``beta`` (elementwise, no state)."""
        raise NotImplementedError

    def update(self, current_kl: float, n_steps: int = 1) -> float:
        """Observe the KL measured with the current coefficient; return the new coefficient.

        Parameters
        ----------
        current_kl : float
            The KL of the latest batch (in the units the target uses: nats per sequence or per token).
        n_steps : int
            Number of training steps (or samples, as TRL counts) since the last update; only the
            proportional controller uses it.
        """
        kl = _check_kl(current_kl)
        n = check_positive_int(n_steps, "n_steps")
        self._beta = float(self.next_beta(self._beta, kl, n))
        self._kl_seen.append(kl)
        self._betas.append(self._beta)
        return self._beta


@dataclass
class FixedKLController(KLController):
    """A constant coefficient: :math:`\\beta_{t+1} = \\beta_t`.

    Parameters
    ----------
    kl_coef : float
        The coefficient, >= 0.
    """

    kl_coef: float = 0.1

    def __post_init__(self) -> None:
        self.kl_coef = check_coef(self.kl_coef, "kl_coef")
        self._start(self.kl_coef)

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        return np.broadcast_arrays(np.asarray(beta, dtype=float), np.asarray(kl))[0].copy()


@dataclass
class AdaptiveKLController(KLController):
    r"""Proportional KL controller of Ziegler et al. (2019).

    .. math::  e_t = \mathrm{clip}\!\left(\frac{\mathrm{KL}_t}{\mathrm{KL}_{\mathrm{target}}} - 1,
               -0.2,\, 0.2\right), \qquad \beta_{t+1} = \beta_t \left(1 + e_t \frac{n}{H}\right)

    with :math:`n` the steps since the last update and :math:`H` the horizon. The clip bounds each
    relative change by :math:`0.2\,n/H`; with TRL's defaults (``horizon=10000``, ``n_steps`` = batch size)
    :math:`\beta` moves slowly and smoothly.

    Parameters
    ----------
    init_kl_coef : float
        Initial :math:`\beta` (lm-human-preferences: 0.15; TRL's old PPO: 0.2), > 0.
    target : float
        Target KL, > 0 (TRL: 6 nats per sequence).
    horizon : float
        :math:`H`, > 0 (TRL, OpenRLHF, verl: 10000).

    References
    ----------
    D. Ziegler et al., "Fine-Tuning Language Models from Human Preferences", 2019, and
    ``lm_human_preferences/train_policy.py`` (``AdaptiveKLController``).
    """

    init_kl_coef: float = 0.2
    target: float = 6.0
    horizon: float = 10000.0

    def __post_init__(self) -> None:
        self.init_kl_coef = check_positive(self.init_kl_coef, "init_kl_coef")
        self.target = check_positive(self.target, "target")
        self.horizon = check_positive(self.horizon, "horizon")
        self._start(self.init_kl_coef)

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        error = np.clip(np.asarray(kl) / self.target - 1.0, -0.2, 0.2)  # e_t
        return beta * (1.0 + error * n_steps / self.horizon)


@dataclass
class DoublingKLController(KLController):
    r"""Band ("bang-bang") rule: double above the band, halve below it, clamp.

    .. math::  \beta_{t+1} = \mathrm{clip}\left(\begin{cases}
               f\,\beta_t & \mathrm{KL}_t > b \cdot \mathrm{KL}_{\mathrm{target}} \\
               \beta_t / f & \mathrm{KL}_t < \mathrm{KL}_{\mathrm{target}} / b \\
               \beta_t & \text{otherwise}\end{cases},\ \beta_{\min},\ \beta_{\max}\right)

    This is the rule of the source handbook's section 8, there labelled "InstructGPT style"; neither
    InstructGPT nor the libraries use it. Inside the band it does nothing, so :math:`\beta` stays wherever
    the last excursion left it, at a clamp if the excursion was long. It has no horizon.

    Parameters
    ----------
    init_kl_coef : float
        Initial :math:`\beta`, within ``[min_coef, max_coef]``.
    target_kl : float
        Target KL, > 0.
    factor : float
        :math:`f` > 1, the multiplicative step (2: doubling).
    band : float
        :math:`b` > 1, the half-width of the dead band as a ratio (1.5: [target/1.5, 1.5 target]).
    min_coef, max_coef : float
        The clamp, 0 < min_coef <= max_coef.
    """

    init_kl_coef: float = 0.1
    target_kl: float = 6.0
    factor: float = 2.0
    band: float = 1.5
    min_coef: float = 1e-3
    max_coef: float = 10.0

    def __post_init__(self) -> None:
        self.init_kl_coef, self.min_coef, self.max_coef = _check_clamp(
            self.init_kl_coef, self.min_coef, self.max_coef
        )
        self.target_kl = check_positive(self.target_kl, "target_kl")
        for name in ("factor", "band"):
            v = check_positive(getattr(self, name), name)
            if v <= 1:
                raise ValueError(f"{name} must be > 1, got {v}")
            setattr(self, name, v)
        self._start(self.init_kl_coef)

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        kl = np.asarray(kl)
        scale = np.where(
            kl > self.band * self.target_kl,
            self.factor,
            np.where(kl < self.target_kl / self.band, 1.0 / self.factor, 1.0),
        )
        return np.clip(beta * scale, self.min_coef, self.max_coef)


@dataclass
class ExponentialKLController(KLController):
    r"""Smooth multiplicative rule of the source handbook's section 10.

    .. math::  \beta_{t+1} = \mathrm{clip}\left(\beta_t \exp\!\left(g\,
               \frac{\mathrm{KL}_t - \mathrm{KL}_{\mathrm{target}}}{\mathrm{KL}_{\mathrm{target}}}\right),
               \ \beta_{\min},\ \beta_{\max}\right)

    Unlike the proportional controller its error is not clipped, so a large excursion moves
    :math:`\beta` a lot in one step; the clamp bounds it.

    Parameters
    ----------
    init_kl_coef : float
        Initial :math:`\beta`, within ``[min_coef, max_coef]``.
    target_kl : float
        Target KL, > 0.
    gain : float
        :math:`g` > 0 (the handbook uses 0.12).
    min_coef, max_coef : float
        The clamp (the handbook uses [0.02, 0.5]).
    """

    init_kl_coef: float = 0.1
    target_kl: float = 6.0
    gain: float = 0.12
    min_coef: float = 0.02
    max_coef: float = 0.5

    def __post_init__(self) -> None:
        self.init_kl_coef, self.min_coef, self.max_coef = _check_clamp(
            self.init_kl_coef, self.min_coef, self.max_coef
        )
        self.target_kl = check_positive(self.target_kl, "target_kl")
        self.gain = check_positive(self.gain, "gain")
        self._start(self.init_kl_coef)

    def next_beta(self, beta: ArrayLike, kl: ArrayLike, n_steps: int = 1) -> ArrayLike:
        relative_error = (np.asarray(kl) - self.target_kl) / self.target_kl
        return np.clip(beta * np.exp(self.gain * relative_error), self.min_coef, self.max_coef)
