"""The invented training-dynamics models of book section 10 (vectorised over β and seeds).

**Nothing in this module is measured.** The formulas below are the source handbook's §10 toy
models: made-up curves chosen to look plausible, with constants (18, 8, 0.08, 0.14, ...) that no
experiment produced. They are useful to *illustrate* ideas (β sets where a run settles; a
controller holds KL near a target), not as evidence about real RLHF. Section 11 checks the
same claims on a real (small, exact) RLHF run.

Two models:

1. :func:`simulate_training_trajectory` (β fixed, the "reward vs KL" picture). The KL relaxes
   towards an equilibrium that shrinks with β, and a learned reward model rewards KL, with an
   extrapolating bonus above 10 nats (the "unreliable" region)::

       KL*(β)    = 18 / (1 + 8 β)
       KL^(k+1)  = max(0, KL^(k) + 0.08 (KL*(β) − KL^(k)) + σ ε_k)
       r^(k+1)   = s (2 (1 − exp(−KL^(k+1) / 5)) + 0.08 max(0, KL^(k+1) − 10)) + σ η_k

   with KL^(0) = 0, r^(0) = 0, noise σ = ``noise_scale``, reward scale s = ``reward_scale``.

2. :func:`simulate_training_with_controller` (β from a controller, the "fixed vs adaptive"
   picture). Optimisation pushes KL up by a constant, the penalty pulls it back in proportion
   to β·KL::

       KL^(k+1)  = max(0.1, KL^(k) + 0.14 − 0.08 β_k KL^(k) + σ_KL ε_k)
       β_{k+1}   = controller.next_beta(β_k, KL^(k+1))
       r^(k+1)   = 1.5 (1 − exp(−KL^(k+1) / 5)) + σ_r η_k

   with KL^(0) = 0.5. With β fixed, KL settles where 0.14 = 0.08 β KL, i.e. KL = 1.75 / β.

Randomness. Every simulation draws its standard-normal disturbances ε, η once, up front, as a
:class:`TrainingNoise` (:func:`draw_training_noise`), shape (N, n_steps) each, and every β row
uses the same draws ("common random numbers"). So two calls with generators seeded alike see
identical disturbances, whatever the β or the controller: differences between the runs are
caused by β or by the controller alone. A :class:`TrainingNoise` can also be passed in directly.

Each model's one step is a function of its own (:func:`trajectory_step`, :func:`controlled_step`):
the simulations apply it to all runs at once, and the benchmark's one-run-at-a-time baseline
(:func:`kltutorial.studies.bench_simulation.scalar_training_trajectory`) applies it to one number at a
time, so the model is written once.

Shapes: K β values (or initial β values), N seeds, and ``n_steps + 1`` recorded steps along the last
axis (index 0 is the starting state, recorded without measurement noise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._validation import check_coef, check_positive, check_positive_int, check_rng
from ..controllers import KLController

__all__ = [
    "illustrative_token_kl_patterns",
    "TrainingNoise",
    "TrainingTrajectories",
    "ControlledTraining",
    "draw_training_noise",
    "equilibrium_kl",
    "learned_reward",
    "trajectory_step",
    "controlled_reward",
    "controlled_step",
    "simulate_training_trajectory",
    "simulate_training_with_controller",
]

# Constants of the invented models (handbook §10). None of them was measured.
_MAX_KL = 18.0  # KL*(0): how far an unpenalised run drifts (nats)
_BETA_SENSITIVITY = 8.0  # how fast KL*(β) falls with β
_RELAXATION = 0.08  # fraction of the gap to KL* closed per step (time constant ~12.5 steps)
_RELIABLE_KL = 10.0  # beyond this KL the learned reward "extrapolates" (nats)
_PUSH = 0.14  # optimisation pressure: KL gained per step without a penalty (nats)
_PULL = 0.08  # restoring force per unit of β·KL
_KL_FLOOR = 0.1  # controller model: KL never falls below this (nats)
_KL_START = 0.5  # controller model: KL at step 0 (nats)


def _scalar_or_array(x: np.ndarray) -> float | np.ndarray:
    """A Python float for 0-d results, the array otherwise."""
    return float(x) if np.ndim(x) == 0 else x


def _readonly(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


@dataclass(frozen=True)
class TrainingNoise:
    """Standard-normal disturbances for one simulation, shared by every β row.

    Attributes
    ----------
    kl : ndarray, shape (N, n_steps)
        ε: disturbance of the KL update at each step (scaled by the simulation's KL noise).
    reward : ndarray, shape (N, n_steps)
        η: measurement noise of the reward at each step (scaled by the reward noise).
    """

    kl: np.ndarray
    reward: np.ndarray

    def __post_init__(self) -> None:
        kl = np.asarray(self.kl, dtype=float)
        reward = np.asarray(self.reward, dtype=float)
        if kl.ndim != 2 or reward.shape != kl.shape:
            raise ValueError(
                "noise: expected kl and reward arrays of the same shape (N, n_steps), "
                f"got {kl.shape} and {reward.shape}"
            )
        if kl.shape[0] < 1 or kl.shape[1] < 1:
            raise ValueError(f"noise: expected at least one seed and one step, got {kl.shape}")
        if not (np.isfinite(kl).all() and np.isfinite(reward).all()):
            raise ValueError("noise: disturbances must be finite")
        object.__setattr__(self, "kl", kl)
        object.__setattr__(self, "reward", reward)

    @property
    def n_seeds(self) -> int:
        return self.kl.shape[0]

    @property
    def n_steps(self) -> int:
        return self.kl.shape[1]


def draw_training_noise(n_seeds: int, n_steps: int, rng: np.random.Generator) -> TrainingNoise:
    """Draw the disturbances of a simulation, in a fixed order: all ε, then all η.

    Parameters
    ----------
    n_seeds : int
        N, the number of independent runs.
    n_steps : int
        Number of training steps.
    rng : numpy.random.Generator

    Returns
    -------
    TrainingNoise
        ``kl`` and ``reward``, shape (N, n_steps) each, standard normal.
    """
    n_seeds = check_positive_int(n_seeds, "n_seeds")
    n_steps = check_positive_int(n_steps, "n_steps")
    rng = check_rng(rng)
    z = rng.standard_normal((2, n_seeds, n_steps))
    return TrainingNoise(kl=z[0], reward=z[1])


def _resolve_noise(
    noise: TrainingNoise | None,
    rng: np.random.Generator | None,
    n_seeds: int | None,
    n_steps: int | None,
    default_steps: int,
    default_seeds: int = 1000,
) -> TrainingNoise:
    """Use ``noise`` if given (checking n_seeds/n_steps agree), else draw it from ``rng``.

    Without ``noise``, :func:`draw_training_noise` checks ``rng`` (and says what to pass).
    """
    if noise is None:
        return draw_training_noise(
            default_seeds if n_seeds is None else n_seeds,
            default_steps if n_steps is None else n_steps,
            rng,
        )
    if not isinstance(noise, TrainingNoise):
        raise TypeError(f"noise: expected a TrainingNoise, got {type(noise).__name__}")
    if rng is not None:
        raise ValueError("rng: pass either rng or noise, not both")
    if n_seeds is not None and check_positive_int(n_seeds, "n_seeds") != noise.n_seeds:
        raise ValueError(f"n_seeds: {n_seeds} disagrees with noise of {noise.n_seeds} seeds")
    if n_steps is not None and check_positive_int(n_steps, "n_steps") != noise.n_steps:
        raise ValueError(f"n_steps: {n_steps} disagrees with noise of {noise.n_steps} steps")
    return noise


def _as_betas(betas: float | Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    values = np.atleast_1d(np.asarray(betas))
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{name}: expected a number or a non-empty 1-d sequence, got {values.shape}")
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise TypeError(f"{name}: expected real numbers, got dtype {values.dtype}")
    for i, b in enumerate(values):
        check_coef(b.item(), f"{name}[{i}]")
    return values.astype(float)


# --------------------------------------------------------------------------------------------
# Model 1: reward vs KL at a fixed β
# --------------------------------------------------------------------------------------------


def equilibrium_kl(beta: float | np.ndarray) -> float | np.ndarray:
    """Invented equilibrium KL of model 1: ``KL*(β) = 18 / (1 + 8 β)`` (nats).

    >>> equilibrium_kl(0.25)
    6.0
    """
    return _scalar_or_array(_MAX_KL / (1.0 + _BETA_SENSITIVITY * np.asarray(beta, dtype=float)))


def learned_reward(kl: float | np.ndarray, reward_scale: float = 1.0) -> float | np.ndarray:
    """Invented learned-reward curve of model 1 (noise-free).

    ``r(KL) = s (2 (1 − exp(−KL / 5)) + 0.08 max(0, KL − 10))``: it saturates at 2, except that
    beyond 10 nats it keeps growing linearly, the extrapolation a real reward model might make
    far from its training data (the reward-hacking region).

    >>> learned_reward(0.0), round(learned_reward(20.0), 3)
    (0.0, 2.763)
    """
    kl = np.asarray(kl, dtype=float)
    bonus = 0.08 * np.maximum(0.0, kl - _RELIABLE_KL)  # extrapolation beyond 10 nats
    return _scalar_or_array(reward_scale * (2.0 * (1.0 - np.exp(-kl / 5.0)) + bonus))


def trajectory_step(
    kl: float | np.ndarray, beta: float | np.ndarray, eps: float | np.ndarray, noise_scale: float
) -> float | np.ndarray:
    """One step of invented model 1: ``KL^(k+1) = max(0, KL^(k) + 0.08 (KL*(β) − KL^(k)) + σ ε_k)``.

    The KL closes 8 % of its gap to the equilibrium :func:`equilibrium_kl` and gets a Gaussian kick
    σ ε_k; it is floored at 0. A formula on numbers or on arrays that broadcast together, like
    :func:`learned_reward`: it does not check its inputs (the simulation checks them once).

    >>> trajectory_step(0.0, 0.25, 0.0, 0.08)  # 8 % of the way to KL* = 6
    0.48
    >>> trajectory_step(1.0, 0.25, -20.0, 0.08)  # a large negative kick stops at the floor
    0.0
    """
    kl = np.asarray(kl, dtype=float)
    gap = np.asarray(equilibrium_kl(beta)) - kl
    return _scalar_or_array(np.maximum(0.0, kl + _RELAXATION * gap + noise_scale * np.asarray(eps)))


@dataclass(frozen=True)
class TrainingTrajectories:
    """Result of :func:`simulate_training_trajectory` (invented model 1).

    Attributes
    ----------
    betas : ndarray, shape (K,)
    kl : ndarray, shape (K, N, n_steps + 1)
        KL from the reference (nats); ``kl[..., 0] = 0``.
    reward : ndarray, shape (K, N, n_steps + 1)
        Learned reward with measurement noise; ``reward[..., 0] = 0``.
    unreliable_kl : float
        KL (nats) beyond which the invented reward model extrapolates (10).
    """

    betas: np.ndarray
    kl: np.ndarray
    reward: np.ndarray
    unreliable_kl: float = _RELIABLE_KL

    @property
    def equilibrium_kl(self) -> np.ndarray:
        """``KL*(β)`` for each β, shape (K,)."""
        return np.asarray(equilibrium_kl(self.betas))

    @property
    def n_seeds(self) -> int:
        return self.kl.shape[1]

    @property
    def n_steps(self) -> int:
        return self.kl.shape[2] - 1


def simulate_training_trajectory(
    betas: float | Sequence[float] | np.ndarray,
    n_steps: int | None = None,
    n_seeds: int | None = None,
    rng: np.random.Generator | None = None,
    reward_scale: float = 1.0,
    noise_scale: float = 0.08,
    *,
    noise: TrainingNoise | None = None,
) -> TrainingTrajectories:
    r"""Simulate the invented model 1 for several fixed β and many seeds at once.

    **An invented, illustrative model, not measured** (see the module docstring)::

        KL^(k+1) = max(0, KL^(k) + 0.08 (18 / (1 + 8 β) − KL^(k)) + σ ε_k),   KL^(0) = 0
        r^(k+1)  = learned_reward(KL^(k+1), s) + σ η_k,                    r^(0) = 0

    The recursion is sequential in time, so the loop runs over steps; each step updates all
    K β values and N seeds at once.

    Parameters
    ----------
    betas : float or sequence of float, shape (K,)
        KL coefficients, each >= 0.
    n_steps : int, optional
        Number of training steps (default 100; taken from ``noise`` if that is given).
    n_seeds : int, optional
        N, independent runs per β (default 1000; taken from ``noise`` if that is given).
    rng : numpy.random.Generator, optional
        Source of the disturbances (required unless ``noise`` is given).
    reward_scale : float
        s, multiplies the noise-free reward (>= 0).
    noise_scale : float
        σ, standard deviation of both the KL disturbance and the reward noise (>= 0).
    noise : TrainingNoise, optional
        Pre-drawn standard-normal disturbances, shape (N, n_steps), shared by all β.

    Returns
    -------
    TrainingTrajectories
        ``kl`` and ``reward`` of shape (K, N, n_steps + 1).

    Examples
    --------
    >>> res = simulate_training_trajectory([0.1, 1.0], n_steps=300, n_seeds=200,
    ...                                    rng=np.random.default_rng(0))
    >>> res.kl.shape
    (2, 200, 301)
    >>> np.round(np.median(res.kl[:, :, -1], axis=1), 1)  # near KL* = 10 and 2
    array([10.,  2.])
    """
    beta = _as_betas(betas, "betas")
    reward_scale = check_coef(reward_scale, "reward_scale")
    sigma = check_coef(noise_scale, "noise_scale")
    z = _resolve_noise(noise, rng, n_seeds, n_steps, default_steps=100)
    n_steps, n_seeds = z.n_steps, z.n_seeds

    kl = np.zeros((beta.size, n_seeds, n_steps + 1))  # (K, N, n_steps + 1)
    # 1. KL relaxes towards KL*(β) with a Gaussian kick, floored at 0 (sequential in time).
    for t in range(n_steps):
        kl[:, :, t + 1] = trajectory_step(kl[:, :, t], beta[:, None], z.kl[:, t], sigma)
    # 2. The learned reward of each new state, measured with noise (vectorised over time).
    reward = np.zeros_like(kl)
    reward[:, :, 1:] = learned_reward(kl[:, :, 1:], reward_scale) + sigma * z.reward
    _readonly(beta, kl, reward)
    return TrainingTrajectories(betas=beta, kl=kl, reward=reward)


# --------------------------------------------------------------------------------------------
# Model 2: closed loop with a KL controller
# --------------------------------------------------------------------------------------------


def controlled_reward(kl: float | np.ndarray) -> float | np.ndarray:
    """Invented learned-reward curve of model 2 (noise-free): ``1.5 (1 − exp(−KL / 5))``.

    >>> controlled_reward(0.0)
    0.0
    """
    return _scalar_or_array(1.5 * (1.0 - np.exp(-np.asarray(kl, dtype=float) / 5.0)))


def controlled_step(
    kl: float | np.ndarray, beta: float | np.ndarray, eps: float | np.ndarray, noise_scale: float
) -> float | np.ndarray:
    """One step of invented model 2: ``KL^(k+1) = max(0.1, KL^(k) + 0.14 − 0.08 β_k KL^(k) + σ ε_k)``.

    Optimisation pushes the KL up by 0.14 nats, the penalty pulls it back in proportion to β·KL,
    and noise kicks it; it is floored at 0.1. With β fixed and no noise it settles at 1.75 / β.
    A formula on numbers or broadcasting arrays; it does not check its inputs.

    >>> round(controlled_step(0.5, 0.1, 1.0, 0.08), 6)  # 0.5 + 0.14 − 0.004 + 0.08
    0.716
    >>> controlled_step(17.5, 0.1, 0.0, 0.08)  # the fixed point 1.75 / β
    17.5
    """
    kl = np.asarray(kl, dtype=float)
    beta, eps = np.asarray(beta), np.asarray(eps)
    return _scalar_or_array(np.maximum(_KL_FLOOR, kl + _PUSH - _PULL * beta * kl + noise_scale * eps))


@dataclass(frozen=True)
class ControlledTraining:
    """Result of :func:`simulate_training_with_controller` (invented model 2).

    Attributes
    ----------
    controller : str
        Class name of the controller used as the template.
    init_betas : ndarray, shape (K,)
    target_kl : float or None
        The KL target (nats), when the controller has one.
    kl : ndarray, shape (K, N, n_steps + 1)
        KL (nats); ``kl[..., 0] = 0.5`` is the start.
    beta : ndarray, shape (K, N, n_steps + 1)
        ``beta[..., t]`` is the coefficient in force during step t + 1 (it produced
        ``kl[..., t + 1]``), i.e. after the controller has seen ``kl[..., 1:t + 1]``;
        ``beta[..., 0]`` is the initial β.
    reward : ndarray, shape (K, N, n_steps + 1)
        Learned reward; index 0 is the noise-free reward of the start.

    The reward penalised at the run's initial β₀ is :attr:`penalized_reward`; at any other price,
    :meth:`penalized_reward_at`.
    """

    controller: str
    init_betas: np.ndarray
    target_kl: float | None
    kl: np.ndarray
    beta: np.ndarray
    reward: np.ndarray

    @property
    def n_seeds(self) -> int:
        return self.kl.shape[1]

    @property
    def n_steps(self) -> int:
        return self.kl.shape[2] - 1

    @property
    def penalized_reward(self) -> np.ndarray:
        """``reward − β₀ · kl`` with each row's *initial* β₀, shape (K, N, n_steps + 1).

        Priced at the initial β₀, not at the β in force: controllers started from the same β₀ then
        pay the same for every nat of KL, so the comparison measures what each run's drift cost,
        rather than changing the price whenever an adaptive β moves (which would make the adaptive
        run's score drop just because its controller raised β).
        """
        return self._priced(self.init_betas[:, None, None])

    def penalized_reward_at(self, beta: float) -> np.ndarray:
        """``reward − β · kl`` at one price β for every row, shape (K, N, n_steps + 1).

        >>> from kltutorial.controllers import FixedKLController
        >>> res = simulate_training_with_controller(FixedKLController(0.3), n_steps=2, n_seeds=1,
        ...                                         rng=np.random.default_rng(0))
        >>> bool(np.all(res.penalized_reward_at(0.3) == res.penalized_reward))
        True
        """
        return self._priced(check_coef(beta, "beta"))

    def _priced(self, beta: float | np.ndarray) -> np.ndarray:
        penalized = self.reward - beta * self.kl
        _readonly(penalized)
        return penalized


def _controller_target(controller: KLController) -> float | None:
    for name in ("target_kl", "target"):
        value = getattr(controller, name, None)
        if value is not None:
            return float(value)
    return None


def simulate_training_with_controller(
    controller: KLController,
    init_betas: float | Sequence[float] | np.ndarray | None = None,
    target_kl: float | None = None,
    n_steps: int | None = None,
    n_seeds: int | None = None,
    rng: np.random.Generator | None = None,
    kl_noise: float = 0.08,
    reward_noise: float = 0.05,
    *,
    samples_per_update: int = 1,
    noise: TrainingNoise | None = None,
) -> ControlledTraining:
    r"""Simulate the invented model 2 in closed loop with a KL controller, over many seeds.

    **An invented, illustrative model, not measured** (see the module docstring). Each step:

    1. the policy moves: ``KL^(k+1) = max(0.1, KL^(k) + 0.14 − 0.08 β_k KL^(k) + σ_KL ε_k)``;
    2. the reward is measured: ``r^(k+1) = 1.5 (1 − exp(−KL^(k+1)/5)) + σ_r η_k``;
    3. the controller reacts: ``β_{k+1} = controller.next_beta(β_k, KL^(k+1), samples_per_update)``.

    The controller object is only a *template*: its pure rule ``next_beta`` is applied
    elementwise to all K × N runs, and its state is not touched. Use
    :class:`~kltutorial.controllers.FixedKLController` for the fixed case,
    ``ExponentialKLController(gain=0.12, min_coef=0.02, max_coef=0.5)`` for the handbook's
    adaptive rule, or :class:`~kltutorial.controllers.AdaptiveKLController` (Ziegler et al.).

    The result's ``penalized_reward``, ``r^(k) − β₀ KL^(k)``, prices KL at the run's *initial* β₀
    (see :attr:`ControlledTraining.penalized_reward`).

    Parameters
    ----------
    controller : KLController
        Template controller (any object of kltutorial.controllers).
    init_betas : float or sequence of float, shape (K,), optional
        Initial β for each row (default: ``controller.value``), each >= 0.
    target_kl : float, optional
        Recorded in the result for plotting; defaults to the controller's own target
        (``target_kl`` or ``target``). Must agree with it if both exist: the simulation's
        dynamics use the controller's target only.
    n_steps : int, optional
        Training steps (default 200; taken from ``noise`` if that is given).
    n_seeds : int, optional
        N (default 1000; taken from ``noise`` if that is given).
    rng : numpy.random.Generator, optional
        Source of the disturbances (required unless ``noise`` is given). The same seed gives
        the same disturbances for every controller and every β₀.
    kl_noise : float
        σ_KL >= 0.
    reward_noise : float
        σ_r >= 0.
    samples_per_update : int
        The ``n_steps`` passed to the controller at each update (TRL passes the batch size;
        only the proportional controller uses it).
    noise : TrainingNoise, optional
        Pre-drawn standard-normal disturbances, shape (N, n_steps), shared by all β₀.

    Returns
    -------
    ControlledTraining
        ``kl``, ``beta``, ``reward`` (and ``penalized_reward``) of shape (K, N, n_steps + 1).

    Examples
    --------
    >>> from kltutorial.controllers import FixedKLController
    >>> res = simulate_training_with_controller(FixedKLController(0.1), n_seeds=100,
    ...                                         n_steps=400, rng=np.random.default_rng(0))
    >>> bool(np.all(res.beta == 0.1)), round(float(np.median(res.kl[..., -1])), 0)  # 1.75/β
    (True, 17.0)
    """
    if not isinstance(controller, KLController):
        raise TypeError(
            "controller: expected a kltutorial.controllers controller (e.g. FixedKLController(0.1)), "
            f"got {type(controller).__name__}"
        )
    beta0 = _as_betas(controller.value if init_betas is None else init_betas, "init_betas")
    own_target = _controller_target(controller)
    if target_kl is not None:
        target_kl = check_positive(target_kl, "target_kl")
        if own_target is not None and not np.isclose(target_kl, own_target):
            raise ValueError(
                f"target_kl: {target_kl} disagrees with the controller's target {own_target}; "
                "set the target on the controller"
            )
    else:
        target_kl = own_target
    sigma_kl = check_coef(kl_noise, "kl_noise")
    sigma_r = check_coef(reward_noise, "reward_noise")
    samples_per_update = check_positive_int(samples_per_update, "samples_per_update")
    z = _resolve_noise(noise, rng, n_seeds, n_steps, default_steps=200)
    n_steps, n_seeds = z.n_steps, z.n_seeds

    shape = (beta0.size, n_seeds, n_steps + 1)  # (K, N, n_steps + 1)
    kl = np.empty(shape)
    beta = np.empty(shape)
    kl[:, :, 0] = _KL_START
    beta[:, :, 0] = beta0[:, None]
    for t in range(n_steps):
        current, b = kl[:, :, t], beta[:, :, t]
        # 1. optimisation pushes, the penalty pulls back, noise kicks; KL floored at 0.1.
        kl[:, :, t + 1] = controlled_step(current, b, z.kl[:, t], sigma_kl)
        # 3. the controller's own rule, elementwise over all K x N runs.
        beta[:, :, t + 1] = controller.next_beta(b, kl[:, :, t + 1], samples_per_update)
    # 2. rewards of every state (vectorised over time); the start is recorded noise-free.
    reward = np.empty(shape)
    reward[:, :, 0] = controlled_reward(_KL_START)
    reward[:, :, 1:] = controlled_reward(kl[:, :, 1:]) + sigma_r * z.reward
    _readonly(beta0, kl, beta, reward)
    return ControlledTraining(
        controller=type(controller).__name__,
        init_betas=beta0,
        target_kl=target_kl,
        kl=kl,
        beta=beta,
        reward=reward,
    )


# ----------------------------------------------------------------------------------------------------
# Hand-made per-token KL patterns of the source handbook's section 10 (book section 10).
#
# **Illustrations, not measurements**: three curves drawn to show where in a response KL might
# concentrate (a reformulated opening, a novel conclusion, spikes at specific word choices). The
# measured per-token KL of a real policy is in :func:`kltutorial.exact.per_position_kl`, and the
# book shows the two side by side.


def illustrative_token_kl_patterns(
    seq_len: int = 50, rng: np.random.Generator | None = None, noise: float = 0.15
) -> dict[str, np.ndarray]:
    """Three hand-made per-token KL curves (handbook §10). **Illustrations, not measurements.**

    * ``"reformulated opening"``: ``2 exp(−3 i/(T−1)) + 0.1``, high KL at the first tokens;
    * ``"novel conclusion"``: ``1.5 exp(3 (i/(T−1) − 1)) + 0.1``, high KL at the last tokens;
    * ``"specific word choices"``: 0.2 everywhere, with spikes of height U(1.5, 3) at the
      relative positions 0.1, 0.24, 0.46, 0.7, 0.9 of the sequence.

    Each curve is multiplied by ``exp(noise · ε_i)`` with ε standard normal, so it wiggles but
    stays positive (an exact per-token KL cannot be negative; the handbook's additive noise
    could make it so).

    Parameters
    ----------
    seq_len : int
        T >= 10, number of token positions.
    rng : numpy.random.Generator
        Source of the spike heights and wiggles (required).
    noise : float
        Log-scale size of the wiggles (>= 0).

    Returns
    -------
    dict name -> ndarray, shape (T,)
        KL at each position (nats), every value > 0.
    """
    seq_len = check_positive_int(seq_len, "seq_len")
    if seq_len < 10:
        raise ValueError(f"seq_len: expected at least 10 positions, got {seq_len}")
    rng = check_rng(rng)
    noise = check_coef(noise, "noise")
    u = np.linspace(0.0, 1.0, seq_len)  # relative position in the sequence
    opening = 2.0 * np.exp(-3.0 * u) + 0.1
    conclusion = 1.5 * np.exp(3.0 * (u - 1.0)) + 0.1
    spiky = np.full(seq_len, 0.2)
    spikes = np.round(np.array([0.1, 0.24, 0.46, 0.7, 0.9]) * (seq_len - 1)).astype(int)
    spiky[spikes] = rng.uniform(1.5, 3.0, size=spikes.size)
    wiggle = np.exp(noise * rng.standard_normal((3, seq_len)))
    return {
        "reformulated opening": opening * wiggle[0],
        "novel conclusion": conclusion * wiggle[1],
        "specific word choices": spiky * wiggle[2],
    }
