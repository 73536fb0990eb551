r"""The closed-loop study of KL controllers (book section 7): step responses, their measurements, and
the linearised loop.

**The plant is invented.** It is model 2 of :mod:`kltutorial.studies.dynamics` (the handbook's §10 toy,
:func:`~kltutorial.studies.dynamics.controlled_step`)::

    KL^(k+1) = max(0.1, KL^(k) + 0.14 − 0.08 β_k KL^(k) + σ ε_k)

whose constants no experiment produced; with β fixed it settles at 1.75 / β. (k counts updates;
the book keeps KL_t for the KL at position t of a response, and KL_target for the target.)

This module closes the loop around it with any controller of :mod:`kltutorial.controllers` (their
pure rule ``next_beta``, applied elementwise to all runs), lets the target change during the run (a
*step*), and measures the response as a control engineer would: rise time, overshoot, settling time.

Two results do not depend on the plant at all, only on the controller:

* :func:`updates_to_scale`: the proportional controller of Ziegler et al. (2019) clips its error to
  ±0.2, so one update changes β by a factor of at most ``1 + 0.2 g`` with ``g = n_steps / horizon``;
  scaling β by a factor F takes at least ``log F / log(1 + 0.2 g)`` updates, whatever the plant.
* log β is the running sum of ``log(1 + g e_k)`` (the error's history): integral action on β. It
  removes any lasting offset from the target; by itself it does not make the loop overshoot.

Two results are of this plant, linearised at the target (:func:`linearised_loop`,
:func:`critical_gain`): for the loop of a rule whose log β moves by ``g e_k`` per update, the
determinant of the Jacobian is ``1 − a`` with ``a = 0.14 / KL_target`` (the share of a deviation of
the KL that the plant removes per update at fixed β) whatever the gain. Below the critical gain
``g_c ≈ a / 4`` the eigenvalues are real, an overdamped loop, and the book's step responses do not
overshoot there; above it (complex eigenvalues, an oscillating loop) they do, and more gain no longer
speeds up the decay of the envelope, it only makes the loop swing faster and overshoot more.

Shapes: K rows (controllers, or gains), N seeds, ``n_steps + 1`` recorded steps (index 0 the start).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._validation import check_coef, check_positive, check_positive_int, check_rng
from ..controllers import KLController
from .dynamics import controlled_step

__all__ = [
    "StepResponse",
    "StepMetrics",
    "plant_push_pull",
    "balance_beta",
    "simulate_step_response",
    "measure_step",
    "linearised_loop",
    "critical_gain",
    "updates_to_scale",
]


def plant_push_pull() -> tuple[float, float]:
    """The invented plant's two constants, read from :func:`~kltutorial.studies.dynamics.controlled_step`.

    Returns ``(push, pull)``: the nats gained per step at β = 0 (0.14) and the restoring force per
    unit of β·KL (0.08), so that the noise-free plant is ``KL' = KL + push − pull β KL``.

    >>> tuple(round(v, 6) for v in plant_push_pull())
    (0.14, 0.08)
    """
    push = float(controlled_step(1.0, 0.0, 0.0, 0.0)) - 1.0
    pull = float(controlled_step(1.0, 0.0, 0.0, 0.0) - controlled_step(1.0, 1.0, 0.0, 0.0))
    return push, pull


def balance_beta(target_kl: float) -> float:
    r"""The fixed β at which the noise-free plant holds ``target_kl``: :math:`\beta^* = 0.14 / (0.08\,
    \mathrm{KL}_{\mathrm{target}}) = 1.75 / \mathrm{KL}_{\mathrm{target}}`.

    >>> round(balance_beta(6.0), 6)
    0.291667
    """
    target_kl = check_positive(target_kl, "target_kl")
    push, pull = plant_push_pull()
    return push / (pull * target_kl)


@dataclass(frozen=True)
class StepResponse:
    """Result of :func:`simulate_step_response`.

    Attributes
    ----------
    kl : ndarray, shape (K, N, n_steps + 1)
        KL (nats); ``kl[..., 0]`` is the start, the balance at the first target.
    beta : ndarray, shape (K, N, n_steps + 1)
        ``beta[..., k]`` is in force during step k + 1 (it produced ``kl[..., k + 1]``).
    target_before, target_after : float
        The target (nats) up to and from ``switch_step`` on.
    switch_step : int
        The first step whose KL the controller compares with ``target_after``.
    """

    kl: np.ndarray
    beta: np.ndarray
    target_before: float
    target_after: float
    switch_step: int

    @property
    def n_steps(self) -> int:
        return self.kl.shape[-1] - 1

    @property
    def target(self) -> np.ndarray:
        """The target in force at each recorded step, shape (n_steps + 1,)."""
        t = np.full(self.n_steps + 1, self.target_before)
        t[self.switch_step:] = self.target_after
        return t


def simulate_step_response(
    before: Sequence[KLController],
    after: Sequence[KLController],
    switch_step: int,
    n_steps: int,
    n_seeds: int,
    rng: np.random.Generator,
    samples_per_update: int | Sequence[int] = 1,
    kl_noise: float = 0.08,
) -> StepResponse:
    r"""Closed loop on the invented plant, with the target changed at ``switch_step``.

    Row i runs the rule of ``before[i]`` until the KL of step ``switch_step − 1``, then the rule of
    ``after[i]`` (the same rule with its new target). Every row starts at the balance of the first
    target, :math:`\mathrm{KL}^{(0)} = \mathrm{KL}_{\mathrm{before}}`, :math:`\beta_0 = 1.75 /
    \mathrm{KL}_{\mathrm{before}}`, so the run is still until the step. Each step:

    1. the plant moves, ``KL^(k+1) = controlled_step(KL^(k), β_k, ε_k, σ)``;
    2. the controller of row i reacts, ``β_{k+1} = next_beta(β_k, KL^(k+1), n_i)``.

    Parameters
    ----------
    before, after : sequence of KLController, length K
        The rule of each row before and after the step; every one must have a ``target_kl``, one
        value shared by all of ``before`` and one by all of ``after``.
    switch_step : int
        Between 1 and ``n_steps``.
    n_steps, n_seeds : int
    rng : numpy.random.Generator
        Draws the standard-normal ε, shape (N, n_steps), shared by every row.
    samples_per_update : int or sequence of int (length K)
        The ``n_steps`` each row's rule is passed at every update (the batch size, as the
        libraries pass it).
    kl_noise : float
        σ >= 0; 0 gives the noise-free response (then every seed is the same).

    Returns
    -------
    StepResponse

    Examples
    --------
    >>> from kltutorial.controllers import AdaptiveKLController as P
    >>> res = simulate_step_response([P(0.1, 6.0, 100)], [P(0.1, 4.0, 100)], switch_step=5,
    ...                              n_steps=8, n_seeds=1, rng=np.random.default_rng(0), kl_noise=0.0)
    >>> bool(np.all(res.kl[0, 0, :6] == 6.0)), bool(res.beta[0, 0, 5] > res.beta[0, 0, 4])
    (True, True)
    """
    if isinstance(before, KLController) or isinstance(after, KLController):
        raise TypeError("before, after: expected sequences of controllers, e.g. [controller]")
    before, after = list(before), list(after)
    if len(before) == 0 or len(before) != len(after):
        raise ValueError(f"before, after: expected two non-empty lists of one length, got "
                         f"{len(before)} and {len(after)}")
    targets = []
    for name, group in (("before", before), ("after", after)):
        for i, c in enumerate(group):
            if not isinstance(c, KLController):
                raise TypeError(f"{name}[{i}]: expected a KLController, got {type(c).__name__}")
            if getattr(c, "target_kl", None) is None:
                raise ValueError(f"{name}[{i}]: the controller has no target_kl")
        values = {float(c.target_kl) for c in group}
        if len(values) != 1:
            raise ValueError(f"{name}: every controller must share one target_kl, got {sorted(values)}")
        targets.append(values.pop())
    n_steps = check_positive_int(n_steps, "n_steps")
    n_seeds = check_positive_int(n_seeds, "n_seeds")
    switch_step = check_positive_int(switch_step, "switch_step")
    if switch_step > n_steps:
        raise ValueError(f"switch_step must be <= n_steps = {n_steps}, got {switch_step}")
    if isinstance(samples_per_update, Sequence):
        samples = [check_positive_int(n, f"samples_per_update[{i}]")
                   for i, n in enumerate(samples_per_update)]
        if len(samples) != len(before):
            raise ValueError(f"samples_per_update: expected {len(before)} values, got {len(samples)}")
    else:
        samples = [check_positive_int(samples_per_update, "samples_per_update")] * len(before)
    sigma = check_coef(kl_noise, "kl_noise")
    eps = check_rng(rng).standard_normal((n_seeds, n_steps))  # (N, n_steps)

    shape = (len(before), n_seeds, n_steps + 1)  # (K, N, n_steps + 1)
    kl, beta = np.empty(shape), np.empty(shape)
    kl[:, :, 0], beta[:, :, 0] = targets[0], balance_beta(targets[0])
    for t in range(n_steps):
        kl[:, :, t + 1] = controlled_step(kl[:, :, t], beta[:, :, t], eps[:, t], sigma)
        rules = before if t + 1 < switch_step else after
        for k, (rule, n) in enumerate(zip(rules, samples, strict=True)):
            beta[k, :, t + 1] = rule.next_beta(beta[k, :, t], kl[k, :, t + 1], n)
    kl.setflags(write=False)
    beta.setflags(write=False)
    return StepResponse(kl=kl, beta=beta, target_before=targets[0], target_after=targets[1],
                        switch_step=switch_step)


@dataclass(frozen=True)
class StepMetrics:
    """Rise time, overshoot and settling time of step responses (see :func:`measure_step`).

    Attributes (each an ndarray of the leading shape of the responses)
    ------------------------------------------------------------------
    rise_time : ndarray of float
        Steps from the switch until the response first covers 90 % of the change (NaN if never).
    overshoot : ndarray of float
        Largest excursion beyond the new target after the switch, as a fraction of the change (>= 0).
    settling_time : ndarray of float
        Steps from the switch until the response enters, for good, the band ``±tolerance × |change|``
        around the new target (NaN if it is outside the band at the last step).
    """

    rise_time: np.ndarray
    overshoot: np.ndarray
    settling_time: np.ndarray


def measure_step(
    kl: np.ndarray, before: float, after: float, switch_step: int, tolerance: float = 0.05
) -> StepMetrics:
    r"""Measure step responses: rise time, overshoot, settling time.

    With the change :math:`\Delta = \mathrm{after} - \mathrm{before}` and the normalised response
    :math:`u_k = (\mathrm{KL}^{(k)} - \mathrm{before}) / \Delta` (0 before, 1 on the new target), and
    :math:`k_s` = ``switch_step``:

    * rise time: the first :math:`k - k_s` with :math:`u_k \ge 0.9`;
    * overshoot: :math:`\max(0, \max_{k \ge k_s} u_k - 1)`;
    * settling time: the first :math:`k - k_s` after which :math:`|u - 1| \le` ``tolerance`` to the end.

    Parameters
    ----------
    kl : ndarray, shape (..., n_steps + 1)
        Responses (e.g. ``StepResponse.kl``, or its median over seeds).
    before, after : float
        The old and the new target (nats), different.
    switch_step : int
        Index of the first step measured against the new target.
    tolerance : float
        Half-width of the settling band as a fraction of ``|after − before|`` (> 0).

    Returns
    -------
    StepMetrics

    Examples
    --------
    >>> m = measure_step(np.array([6.0, 6.0, 5.0, 3.5, 3.95, 4.0, 4.0]), 6.0, 4.0, 1)
    >>> float(m.rise_time), float(m.overshoot), float(m.settling_time)
    (2.0, 0.25, 3.0)
    """
    kl = np.asarray(kl, dtype=float)
    before, after = float(before), float(after)
    if not (math.isfinite(before) and math.isfinite(after)) or before == after:
        raise ValueError(f"before, after: expected two different finite targets, got {before}, {after}")
    tolerance = check_positive(tolerance, "tolerance")
    switch_step = check_positive_int(switch_step, "switch_step")
    if kl.ndim == 0 or switch_step >= kl.shape[-1]:
        raise ValueError(f"kl: expected shape (..., n) with n > switch_step = {switch_step}, got {kl.shape}")
    u = (kl[..., switch_step:] - before) / (after - before)  # (..., m), 0 before, 1 on the new target
    m = u.shape[-1]
    steps = np.arange(m, dtype=float)
    risen = u >= 0.9
    rise = np.where(risen.any(axis=-1), np.argmax(risen, axis=-1), np.nan)
    overshoot = np.maximum(0.0, u.max(axis=-1) - 1.0)
    outside = np.abs(u - 1.0) > tolerance
    # the last step outside the band; settled from the one after it (NaN if the last step is outside)
    last_out = np.where(outside.any(axis=-1), m - 1 - np.argmax(outside[..., ::-1], axis=-1), -1)
    settling = np.where(last_out == m - 1, np.nan, steps[np.minimum(last_out + 1, m - 1)])
    return StepMetrics(rise_time=np.asarray(rise, dtype=float), overshoot=np.asarray(overshoot),
                       settling_time=np.asarray(settling, dtype=float))


def linearised_loop(target_kl: float, gain: float) -> np.ndarray:
    r"""Jacobian of the noise-free loop at its balance, in the state :math:`(x, y) = (\mathrm{KL} -
    \mathrm{KL}_{\mathrm{target}}, \log\beta - \log\beta^*)`.

    For a rule whose :math:`\log\beta` moves by :math:`g\,e` with :math:`e = \mathrm{KL}/
    \mathrm{KL}_{\mathrm{target}} - 1` (the proportional controller inside its clip, with
    :math:`g = n/H` to first order; the exponential rule with :math:`g` its ``gain``), the plant
    :math:`\mathrm{KL}' = \mathrm{KL} + p - q\beta\mathrm{KL}` gives, with
    :math:`a = q\beta^* = p / \mathrm{KL}_{\mathrm{target}}` and
    :math:`c = g / \mathrm{KL}_{\mathrm{target}}`,

    .. math::  x' = (1 - a)\,x - p\,y, \qquad y' = y + c\,x'
               \quad\Longrightarrow\quad
               A = \begin{pmatrix} 1 - a & -p \\ c\,(1 - a) & 1 - c\,p\end{pmatrix},

    whose determinant is :math:`1 - a` whatever :math:`g`.

    >>> A = linearised_loop(6.0, 0.05)
    >>> round(float(np.linalg.det(A)), 6) == round(1 - 0.14 / 6, 6)
    True
    """
    target_kl = check_positive(target_kl, "target_kl")
    g = check_positive(gain, "gain")
    p, _ = plant_push_pull()
    a = p / target_kl
    return np.array([[1.0 - a, -p], [g / target_kl * (1.0 - a), 1.0 - g * p / target_kl]])


def critical_gain(target_kl: float) -> float:
    r"""The gain above which the linearised loop oscillates (complex eigenvalues).

    The eigenvalues of :func:`linearised_loop` are complex when :math:`\mathrm{tr}^2 < 4 \det`, i.e.
    :math:`(2 - a - a g)^2 < 4 (1 - a)`, i.e.

    .. math::  g > g_c = \frac{(1 - \sqrt{1 - a})^2}{a} \approx \frac{a}{4}, \qquad
               a = 0.14 / \mathrm{KL}_{\mathrm{target}}.

    Below :math:`g_c` the eigenvalues are real (an overdamped loop).

    >>> round(critical_gain(6.0), 4), round(critical_gain(4.0), 4)
    (0.0059, 0.0089)
    """
    target_kl = check_positive(target_kl, "target_kl")
    p, _ = plant_push_pull()
    a = p / target_kl
    if a >= 1.0:
        raise ValueError(f"target_kl: the linearisation needs target_kl > {p:g} nats, got {target_kl}")
    return (1.0 - math.sqrt(1.0 - a)) ** 2 / a


def updates_to_scale(factor: float, gain: float) -> float:
    r"""Fewest updates of the proportional controller that scale β by ``factor``, on any plant.

    The error is clipped to ±0.2, so one update multiplies β by at most :math:`1 + 0.2 g` (or divides
    it by at least :math:`1/(1 - 0.2 g)`), with :math:`g = n/H`:

    .. math::  N_{\min} = \frac{\log F}{\log(1 + 0.2 g)} \ (F > 1), \qquad
               \frac{\log F}{\log(1 - 0.2 g)} \ (F < 1).

    >>> round(updates_to_scale(2.0, 64 / 10_000), 1)  # doubling β at batch 64, horizon 10,000
    541.9
    """
    factor = check_positive(factor, "factor")
    g = check_positive(gain, "gain")
    if factor == 1.0:
        return 0.0
    if factor > 1.0:
        return math.log(factor) / math.log1p(0.2 * g)
    if 0.2 * g >= 1.0:
        return 1.0  # one update can take β down to the controller's floor
    return math.log(factor) / math.log1p(-0.2 * g)
