r"""KL spikes: flag the steps of a log that lie far from the rolling median of the steps before them
(book section 12).

Part of :mod:`kltutorial.diagnostics`. Shapes: N steps of a log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._validation import check_choice, check_positive, check_positive_int

__all__ = ["MAD_TO_STD", "SpikeReport", "detect_spikes"]

#: :math:`1/\Phi^{-1}(3/4)`: the MAD times this estimates the standard deviation of a normal sample.
MAD_TO_STD: float = 1.482602218505602


@dataclass(frozen=True)
class SpikeReport:
    """The result of :func:`detect_spikes`; arrays of shape (N,), one entry per step of the log.

    Attributes
    ----------
    values : ndarray
        The logged series.
    median, scale : ndarray
        Rolling median of the ``window`` steps before each step, and the robust scale
        ``max(MAD_TO_STD * MAD, min_scale)`` (their mean and standard deviation with ``centre="mean"``);
        NaN for the first ``window`` steps.
    score : ndarray
        ``(values - median) / scale``; NaN for the first ``window`` steps.
    flags : ndarray of bool
        True where the step is a spike.
    threshold : float
    """

    values: np.ndarray
    median: np.ndarray
    scale: np.ndarray
    score: np.ndarray
    flags: np.ndarray
    threshold: float

    @property
    def indices(self) -> np.ndarray:
        """The steps flagged, shape (number of spikes,)."""
        return np.flatnonzero(self.flags)


SIDES: tuple[str, ...] = ("upper", "both")
CENTRES: tuple[str, ...] = ("median", "mean")


def detect_spikes(
    values: Sequence[float] | np.ndarray,
    window: int = 20,
    threshold: float = 6.0,
    *,
    min_scale: float = 1e-9,
    side: str = "upper",
    centre: str = "median",
) -> SpikeReport:
    """Flag the steps of a log that lie far from the rolling median of the steps before them.

    .. math::
        m_t = \\operatorname{median}(x_{t-w}, \\dots, x_{t-1}), \\qquad
        s_t = \\max\\big(1.4826\\, \\operatorname{median}_{j}|x_{t-j} - m_t|,\\; s_\\mathrm{min}\\big),
        \\qquad z_t = \\frac{x_t - m_t}{s_t}

    and step t is a spike when :math:`z_t >` ``threshold`` (``side="upper"``, the KL jumping up) or
    :math:`|z_t| >` ``threshold`` (``side="both"``). Median and MAD ignore a few outliers in the window,
    so one spike neither hides the next nor inflates the scale, unlike a mean and standard deviation; for
    normal noise :math:`1.4826 \\cdot \\mathrm{MAD}` estimates its standard deviation. The window looks
    only backwards, so a flag at step t uses nothing logged after t, as a live monitor must. A lasting
    change of level is flagged until about half the window has seen it.

    Parameters
    ----------
    values : array-like, shape (N,)
        The logged series (e.g. the batch mean of the per-sequence k1 at every step); finite.
    window : int
        w >= 3 past steps; the first w steps get no score.
    threshold : float
        > 0, in robust standard deviations.
    min_scale : float
        > 0, a floor for :math:`s_t`, so that a flat history does not flag rounding noise.
    side : {"upper", "both"}
    centre : {"median", "mean"}
        ``"mean"`` replaces the median and the MAD by the mean and the standard deviation of the window
        (the textbook z-score), for comparison: one spike then inflates the scale for the ``window``
        steps after it and can hide the next one.

    Returns
    -------
    SpikeReport

    Examples
    --------
    >>> x = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 5.0, 1.0]
    >>> detect_spikes(x, window=5, threshold=6.0).indices  # MAD of 1, 1.1, 0.9, 1, 1.2 is 0.1
    array([6])
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a non-empty 1-d series of finite numbers")
    window = check_positive_int(window, "window")
    if window < 3:
        raise ValueError(f"window must be >= 3 past steps, got {window}")
    threshold = check_positive(threshold, "threshold")
    min_scale = check_positive(min_scale, "min_scale")
    check_choice(side, "side", SIDES)
    check_choice(centre, "centre", CENTRES)
    n = x.size
    median = np.full(n, np.nan)
    scale = np.full(n, np.nan)
    if n > window:
        past = np.lib.stride_tricks.sliding_window_view(x, window)[:-1]  # (n - w, w): steps t-w .. t-1
        if centre == "median":
            median[window:] = np.median(past, axis=1)
            spread = MAD_TO_STD * np.median(np.abs(past - median[window:, None]), axis=1)
        else:
            median[window:] = past.mean(axis=1)
            spread = past.std(axis=1, ddof=1)
        scale[window:] = np.maximum(spread, min_scale)
    score = (x - median) / scale
    with np.errstate(invalid="ignore"):
        flags = score > threshold if side == "upper" else np.abs(score) > threshold
    return SpikeReport(values=x, median=median, scale=scale, score=score, flags=flags, threshold=threshold)
