r"""Gao et al.'s functional forms for reward over-optimisation, fitted by least squares (book section 11).

Gao, Schulman and Hilton (2023), "Scaling Laws for Reward Model Overoptimization" (ICML; arXiv
2210.10760), measure how the gold reward :math:`R` of a policy optimised against a proxy reward model
changes with its distance from the initial policy, :math:`d = \sqrt{\mathrm{KL}(\pi \| \pi_\mathrm{init})}`,
and find a different form for each way of optimising:

.. math::
    R_\mathrm{bon}(d) = d\,(\alpha_\mathrm{bon} - \beta_\mathrm{bon}\, d), \qquad
    R_\mathrm{RL}(d) = d\,(\alpha_\mathrm{RL} - \beta_\mathrm{RL} \log d),

for best-of-n sampling and for reinforcement learning, with :math:`R(0) := 0` by definition: :math:`R` is
the gold reward *gained* over the initial policy. Both forms are linear in :math:`(\alpha, \beta)`, so the
least-squares fit is a linear regression without intercept on the two features :math:`d` and
:math:`-d^2` (best-of-n) or :math:`-d \log d` (RL, with :math:`0 \log 0 = 0`). Their :math:`\beta` is not
the KL coefficient of the rest of this package.

* :func:`gao_gain`: :math:`R(d)` for given coefficients;
* :func:`fit_gao`: the least-squares :math:`(\alpha, \beta)` of a set of (KL, gain) points, with the fit's
  :math:`R^2`, RMS error and residuals in a :class:`GaoFit`.

Shapes: M points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import check_choice, check_real

__all__ = ["FORMS", "GaoFit", "gao_gain", "fit_gao"]

#: The two functional forms: ``"bon"`` (best-of-n) and ``"rl"`` (reinforcement learning).
FORMS: tuple[str, ...] = ("bon", "rl")


def _as_points(x: object, name: str, *, nonnegative: bool) -> np.ndarray:
    """A 1-D float array of finite values (>= 0 where ``nonnegative``)."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of real numbers, got {type(x).__name__}") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    if nonnegative and np.any(arr < 0):
        raise ValueError(
            f"{name} must be >= 0 (a KL divergence, in nats); got a minimum of {arr.min():g} "
            "(clip rounding below zero with np.clip(kl, 0, None))"
        )
    return arr


def _features(d: np.ndarray, form: str) -> np.ndarray:
    """The regression features of ``form`` at distances ``d``: columns (d, -d^2) or (d, -d log d), (M, 2)."""
    if form == "bon":
        second = d * d
    else:  # d log d -> 0 as d -> 0
        second = np.where(d > 0, d * np.log(np.where(d > 0, d, 1.0)), 0.0)
    return np.stack([d, -second], axis=1)


def gao_gain(kl: object, alpha: float, beta: float, form: str) -> np.ndarray:
    """Gao et al.'s gold-reward gain at a KL: :math:`R_\\mathrm{bon}(d) = d(\\alpha - \\beta d)` or
    :math:`R_\\mathrm{RL}(d) = d(\\alpha - \\beta \\log d)`, with :math:`d = \\sqrt{\\mathrm{KL}}`.

    Parameters
    ----------
    kl : array_like, shape (M,)
        KL divergences from the initial policy, in nats, each >= 0.
    alpha, beta : float
        The coefficients (finite; any sign).
    form : {"bon", "rl"}
        Best-of-n or reinforcement learning.

    Returns
    -------
    ndarray, shape (M,)
        :math:`R`, in the units of the gold reward; 0 at KL = 0.

    Examples
    --------
    >>> gao_gain([0.0, 1.0, 4.0], alpha=3.0, beta=1.0, form="bon")  # d = 0, 1, 2
    array([0., 2., 2.])
    >>> gao_gain([1.0], alpha=3.0, beta=1.0, form="rl")  # log 1 = 0: R = alpha at d = 1
    array([3.])
    """
    kl = _as_points(kl, "kl", nonnegative=True)
    alpha, beta = check_real(alpha, "alpha"), check_real(beta, "beta")
    form = check_choice(form, "form", FORMS)
    return _features(np.sqrt(kl), form) @ np.array([alpha, beta])


@dataclass(frozen=True)
class GaoFit:
    """The least-squares fit of one of Gao et al.'s forms to (KL, gain) points (:func:`fit_gao`).

    Attributes
    ----------
    form : str
        ``"bon"`` or ``"rl"``.
    alpha, beta : float
        The fitted coefficients of :math:`R(d) = d(\\alpha - \\beta d)` or
        :math:`d(\\alpha - \\beta \\log d)`.
    d : ndarray, shape (M,)
        :math:`\\sqrt{\\mathrm{KL}}` of the points fitted.
    gain : ndarray, shape (M,)
        The gains fitted, :math:`R` at each point.
    residuals : ndarray, shape (M,)
        ``gain`` minus the fitted :math:`R(d)`.
    r2 : float
        :math:`1 - \\sum_i e_i^2 / \\sum_i (R_i - \\bar R)^2`: the share of the gains' variance the form
        explains (1 for a perfect fit; it can be negative, since the form has no intercept).
    rms : float
        :math:`\\sqrt{\\tfrac{1}{M}\\sum_i e_i^2}`, in the units of the gold reward.
    """

    form: str
    alpha: float
    beta: float
    d: np.ndarray
    gain: np.ndarray
    residuals: np.ndarray
    r2: float
    rms: float

    def predict(self, kl: object) -> np.ndarray:
        """The fitted :math:`R` at the KL values ``kl`` (nats, each >= 0), shape (M,)."""
        return gao_gain(kl, self.alpha, self.beta, self.form)

    @property
    def peak_kl(self) -> float:
        """The KL at which the fitted :math:`R` is largest: :math:`d^* = \\alpha / 2\\beta` (best-of-n) or
        :math:`d^* = e^{\\alpha/\\beta - 1}` (RL), returned as :math:`d^{*2}` nats; ``inf`` if
        :math:`\\beta \\le 0` (the form never turns down)."""
        if self.beta <= 0:
            return float("inf")
        if self.form == "bon":
            return float((self.alpha / (2.0 * self.beta)) ** 2)
        return float(np.exp(2.0 * (self.alpha / self.beta - 1.0)))

    @property
    def peak_gain(self) -> float:
        """The largest fitted :math:`R`: :math:`\\alpha^2 / 4\\beta` (best-of-n) or :math:`\\beta d^*` (RL);
        ``inf`` if :math:`\\beta \\le 0`."""
        if self.beta <= 0:
            return float("inf")
        if self.form == "bon":
            return float(self.alpha**2 / (4.0 * self.beta))
        return float(self.beta * np.exp(self.alpha / self.beta - 1.0))

    def rms_where(self, mask: object) -> float:
        """The RMS error over the points selected by the boolean ``mask`` (shape (M,)), e.g. ``fit.d < 1``."""
        mask = np.asarray(mask)
        if mask.dtype != bool or mask.shape != self.d.shape:
            raise ValueError(f"mask must be a boolean array of shape {self.d.shape}, got {mask.dtype} "
                             f"{mask.shape}")
        if not mask.any():
            raise ValueError("mask selects no point")
        return float(np.sqrt(np.mean(self.residuals[mask] ** 2)))


def fit_gao(kl: object, gain: object, form: str) -> GaoFit:
    """Least-squares fit of Gao et al.'s form ``form`` to points :math:`(\\mathrm{KL}_i, R_i)`.

    .. math::
        (\\hat\\alpha, \\hat\\beta) = \\arg\\min_{\\alpha, \\beta} \\sum_i \\big(R_i - d_i(\\alpha - \\beta\\,
        g(d_i))\\big)^2, \\qquad d_i = \\sqrt{\\mathrm{KL}_i},

    with :math:`g(d) = d` (best-of-n) or :math:`g(d) = \\log d` (RL). The model is linear in
    :math:`(\\alpha, \\beta)`, so the minimum is the solution of a linear least-squares problem
    (``numpy.linalg.lstsq``), exact up to rounding: points that follow the form exactly give back its
    coefficients. There is no intercept (:math:`R(0) = 0`): pass the gain over the initial policy, the gold
    reward minus that of :math:`\\pi_\\mathrm{init}`. Every point weighs the same, so where the points lie
    densely along d, they weigh more.

    Parameters
    ----------
    kl : array_like, shape (M,)
        KL divergences from the initial policy, in nats, each >= 0.
    gain : array_like, shape (M,)
        The gold-reward gain at each KL, finite.
    form : {"bon", "rl"}
        Best-of-n or reinforcement learning.

    Returns
    -------
    GaoFit

    Raises
    ------
    ValueError
        If fewer than two points have KL > 0 at distinct d: the two coefficients are then not determined.

    Examples
    --------
    >>> kl = np.array([0.25, 1.0, 2.25, 4.0])  # d = 0.5, 1, 1.5, 2
    >>> fit = fit_gao(kl, gao_gain(kl, alpha=3.0, beta=1.0, form="bon"), form="bon")
    >>> round(fit.alpha, 10), round(fit.beta, 10), round(fit.r2, 10), round(fit.peak_kl, 10)  # d* = 1.5
    (3.0, 1.0, 1.0, 2.25)
    """
    kl = _as_points(kl, "kl", nonnegative=True)
    gain = _as_points(gain, "gain", nonnegative=False)
    if gain.shape != kl.shape:
        raise ValueError(f"kl and gain must have the same length, got {kl.size} and {gain.size}")
    form = check_choice(form, "form", FORMS)
    d = np.sqrt(kl)
    if np.unique(d[d > 0]).size < 2:
        raise ValueError("fit_gao needs at least two points with distinct KL > 0 to determine alpha and beta")
    X = _features(d, form)  # (M, 2)
    coef, *_ = np.linalg.lstsq(X, gain, rcond=None)
    residuals = gain - X @ coef
    ss_res = float(np.sum(residuals**2))
    ss_tot = float(np.sum((gain - gain.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else -np.inf)
    return GaoFit(
        form=form,
        alpha=float(coef[0]),
        beta=float(coef[1]),
        d=d,
        gain=gain,
        residuals=residuals,
        r2=float(r2),
        rms=float(np.sqrt(ss_res / d.size)),
    )
