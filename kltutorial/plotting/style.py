"""The book's house figure style: colours, line styles, rcParams, and the axis helpers every figure uses.

Readability rules, for colour-blind readers and grayscale prints:

* categorical colours are the Okabe–Ito palette (:data:`PALETTE`), and every series also gets its own
  line style (:data:`LINESTYLES`) and marker (:data:`MARKERS`);
* β is drawn with :func:`beta_colors`: warm (orange) for small β, cool (dark blue) for large β, taken
  from the perceptually uniform ``plasma`` map, whose lightness falls monotonically, so the order of β
  survives in grayscale;
* every axis names its quantity and its unit (nats, steps);
* a quantity measured over many seeds is drawn as its median with a quantile band
  (:func:`plot_median_band`), never as one seed's draw.

Nothing here knows about a section of the book; the figure modules (``controllers``, ``dynamics``,
``experiment``) import from here and never from each other's internals.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from cycler import cycler
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.transforms import ScaledTranslation

__all__ = [
    "FIG_WIDTH",
    "figure_legend_below",
    "fig_size",
    "PALETTE",
    "LINESTYLES",
    "MARKERS",
    "REFERENCE_COLOR",
    "ZONE_COLOR",
    "use_style",
    "series_style",
    "beta_colors",
    "beta_styles",
    "new_axes",
    "new_axes_grid",
    "log_beta_axis",
    "check_quantiles",
    "plot_median_band",
    "save_figure",
    "legend_below",
]

#: Width of every figure in inches, that of the book's text column. Every figure is drawn at the width
#: it is shown: the text column is about 780 px, i.e. about 7 inches at the 110 px/inch of the house
#: dpi, so 10-11 pt text lands at 14-17 px on a desktop screen (body text is 16 px) instead of being
#: scaled down. Multi-panel figures share this width.
FIG_WIDTH = 7.0


def fig_size(height: float) -> tuple[float, float]:
    """``(FIG_WIDTH, height)`` in inches: the size of every figure in the book."""
    return (FIG_WIDTH, float(height))


#: Categorical colours, after Okabe & Ito (2008), "Color Universal Design", distinguishable under
#: the common colour-vision deficiencies. Yellow (#F0E442) is left out: it vanishes on white paper.
PALETTE: tuple[str, ...] = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#000000",  # black
)
# Line styles and markers separate series when colour is lost (grayscale print).
#: One line style per :data:`PALETTE` colour, so that series stay apart in grayscale.
LINESTYLES: tuple[Any, ...] = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)), "-")
#: One marker per :data:`PALETTE` colour, likewise.
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X")

# Neutral colours for reference elements (targets, shaded zones, marked regions).
REFERENCE_COLOR = "0.25"  #: Grey of reference lines and markers (a target, the exact value).
ZONE_COLOR = "0.55"  #: Grey of shaded or hatched zones (a stable band, an unreliable region).

# Part of plasma used for β: 0.8 is orange (warm, small β), 0.0 dark blue (cool, large β).
# The top of plasma (bright yellow) is cut off because it is unreadable on white.
_BETA_CMAP_RANGE = (0.8, 0.0)


#: Where :func:`save_figure` writes, relative to the notebook (book/): book/images/figures/.
FIGURE_FOLDER = Path("images") / "figures"


def save_figure(fig: Figure, name: str, folder: str | Path = FIGURE_FOLDER) -> Path:
    """Write ``fig`` as ``<folder>/<name>.png`` for a ``{figure}`` directive, and return the path.

    The book places its figures with MyST's ``{figure}`` directive (number, caption, alt text,
    ``:name:`` for ``{numref}``), which both the built book and JupyterLab's jupyterlab-myst render,
    from the file this writes when the notebook runs. The PNG is written at the figure's own dpi
    (the house style's 110, at which a :data:`FIG_WIDTH` figure fills the text column), cropped to
    its content, and without the writer's version in its metadata, so that re-running a notebook
    on the same machine rewrites the same bytes.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure to write.
    name : str
        The file's stem, also the figure's ``:name:``: lower-case letters, digits and hyphens.
    folder : str or Path
        Where to write, relative to the working directory (the notebook's folder); created if
        missing.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", name):
        raise ValueError(f"name must be lower-case words joined by hyphens, such as 'fig-kl-estimates', "
                         f"got {name!r}")
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be a str or Path, got {type(folder).__name__}")
    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi="figure", bbox_inches="tight", metadata={"Software": None})
    return path


def legend_below(ax: Axes) -> dict[str, Any]:
    """Keyword arguments of ``legend`` that put it under ``ax``, just below its tick labels and x label.

    The drop is measured on the axis as drawn (log ticks with exponents are taller than plain ones) and
    is in points, so it holds whatever height the layout gives the axes; constrained layout makes room.
    Use it as ``ax.legend(**legend_below(ax))`` once the axis is labelled, so that the legend never
    covers the data.
    """
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    axis = ax.xaxis.get_tightbbox()  # tick labels and x label, in pixels (None if the axis is hidden)
    below = 0.0 if axis is None else ax.bbox.y0 - axis.y0  # from the axes' bottom edge
    offset = ScaledTranslation(0.0, -max(below, 0.0) / ax.figure.dpi, ax.figure.dpi_scale_trans)
    return {"loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "bbox_transform": ax.transAxes + offset}


def use_style() -> None:
    """Set the book's matplotlib style (rcParams) for the current process.

    Readable font sizes, a light grid, no top/right spines, constrained layout, a colour cycle
    that also cycles line styles (so default series stay apart in grayscale), screen dpi 110
    and saved-figure dpi 150.
    """
    n = min(len(PALETTE), len(LINESTYLES))
    mpl.rcParams.update(
        {
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "savefig.bbox": "tight",
            "figure.figsize": (FIG_WIDTH, 4.2),
            "figure.constrained_layout.use": True,
            "font.size": 11,
            "axes.titlesize": 11.5,
            "axes.labelsize": 11,
            "xtick.labelsize": 10,
            "ytick.labelsize": 10,
            "legend.fontsize": 9.5,
            "legend.frameon": False,
            "figure.titlesize": 12.5,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "grid.linewidth": 0.6,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "lines.linewidth": 1.8,
            "lines.markersize": 5,
            "axes.prop_cycle": cycler(color=list(PALETTE[:n])) + cycler(linestyle=list(LINESTYLES[:n])),
        }
    )


def series_style(i: int) -> dict[str, Any]:
    """Colour, line style and marker of the ``i``-th categorical series (cycles after 7)."""
    return {
        "color": PALETTE[i % len(PALETTE)],
        "linestyle": LINESTYLES[i % len(LINESTYLES)],
        "marker": MARKERS[i % len(MARKERS)],
    }


def beta_colors(betas: Sequence[float] | np.ndarray) -> list[str]:
    """Colours for a set of β values: warm (orange) for small β, cool (dark blue) for large β.

    Colours are assigned by the rank of β (so log-spaced sweeps are spread evenly over the
    map), in the order the β values were given. Equal β values get equal colours.

    Parameters
    ----------
    betas : sequence of float, shape (K,)

    Returns
    -------
    list of str, length K
        Hex colours from the ``plasma`` map, lightness decreasing with β.

    Examples
    --------
    >>> beta_colors([0.01, 1.0])  # small β orange, large β dark blue
    ['#fca636', '#0d0887']
    """
    values = np.asarray(betas, dtype=float).reshape(-1)
    if values.size == 0:
        return []
    unique = np.unique(values)
    rank = np.searchsorted(unique, values)
    frac = rank / (len(unique) - 1) if len(unique) > 1 else np.zeros_like(rank, dtype=float)
    lo, hi = _BETA_CMAP_RANGE
    cmap = mpl.colormaps["plasma"]
    return [to_hex(cmap(lo + (hi - lo) * f)) for f in frac]


def beta_styles(betas: Sequence[float] | np.ndarray) -> list[dict[str, Any]]:
    """Colour (:func:`beta_colors`), line style and marker for each β, in the order given."""
    colors = beta_colors(betas)
    values = np.asarray(betas, dtype=float).reshape(-1)
    rank = np.searchsorted(np.unique(values), values)
    return [
        {"color": c, "linestyle": LINESTYLES[r % len(LINESTYLES)], "marker": MARKERS[r % len(MARKERS)]}
        for c, r in zip(colors, rank, strict=True)
    ]


# --------------------------------------------------------------------------------------------
# Axis helpers
# --------------------------------------------------------------------------------------------


def new_axes(ax: Axes | None, **subplots_kw: Any) -> Axes:
    """``ax`` if given, else the axes of a new figure made with ``plt.subplots(**subplots_kw)``."""
    if ax is not None:
        return ax
    _, ax = plt.subplots(**subplots_kw)
    return ax


def new_axes_grid(axes: Any, nrows: int, ncols: int, **subplots_kw: Any) -> np.ndarray:
    """Return ``axes`` as a flat array of ``nrows * ncols`` axes, creating a figure if None."""
    if axes is None:
        _, axes = plt.subplots(nrows, ncols, squeeze=False, **subplots_kw)
    flat = np.asarray(axes, dtype=object).reshape(-1)
    if flat.size != nrows * ncols:
        raise ValueError(f"axes: expected {nrows * ncols} axes, got {flat.size}")
    return flat


def log_beta_axis(ax: Axes) -> None:
    """Log-scale y axis with plain tick labels at 1, 2 and 5 times each power of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def check_quantiles(band: tuple[float, float]) -> tuple[float, float]:
    """Check a pair of quantiles ``0 <= lo < hi <= 1`` (the ``band`` argument of the figures)."""
    lo, hi = (float(q) for q in band)
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"band: expected two quantiles 0 <= lo < hi <= 1, got {band!r}")
    return lo, hi


def plot_median_band(
    ax: Axes,
    x: np.ndarray,
    samples: np.ndarray,
    *,
    band: tuple[float, float] = (0.1, 0.9),
    label: str | None = None,
    color: str | None = None,
    linestyle: Any = "-",
    band_alpha: float = 0.2,
    **line_kw: Any,
) -> Axes:
    """Draw the median over seeds of ``samples`` against ``x`` with a quantile band.

    Parameters
    ----------
    ax : Axes
    x : ndarray, shape (M,)
        Positions along the x axis (e.g. training steps).
    samples : ndarray, shape (N, M)
        One row per seed (N seeds). The line is the median over rows; the shaded band spans
        the ``band`` quantiles (default 10 % to 90 %). One row draws the line alone.
    band : (float, float)
        Lower and upper quantile of the band.
    label, color, linestyle, **line_kw
        Passed to ``ax.plot`` for the median line (the band gets the same colour, no label).

    Returns
    -------
    Axes
    """
    lo, hi = check_quantiles(band)
    samples = np.asarray(samples, dtype=float)
    if samples.ndim == 1:
        samples = samples[None, :]
    x = np.asarray(x, dtype=float)
    if samples.ndim != 2 or samples.shape[1] != x.shape[0]:
        raise ValueError(f"samples: expected shape (N, {x.shape[0]}), got {samples.shape}")
    q_lo, median, q_hi = np.quantile(samples, [lo, 0.5, hi], axis=0)
    (line,) = ax.plot(x, median, label=label, color=color, linestyle=linestyle, **line_kw)
    if samples.shape[0] > 1:
        ax.fill_between(x, q_lo, q_hi, color=line.get_color(), alpha=band_alpha, linewidth=0)
    return ax


def figure_legend_below(ax: Axes, ncol: int) -> None:
    """Move the legend of ``ax`` (its labelled artists) under the figure's panels, in ``ncol`` columns.

    With constrained layout (the house style) the figure grows to make room; otherwise the legend
    sits at the bottom edge.
    """
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    fig = ax.figure
    constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    fig.legend(handles, labels, loc="outside lower center" if constrained else "lower center",
               ncol=min(ncol, len(labels)), fontsize=9)
