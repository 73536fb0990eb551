r"""The book's one interactive figure (section 11): the exact optimum :math:`\pi^*_\beta` under a β slider.

:func:`plot_optimum_slider` builds a plotly figure from precomputed results: for each β of a grid, the
distribution of the number of ``"!"`` under :math:`\pi^*_\beta \propto \pi_\mathrm{ref}\, e^{r/\beta}`
(bars, next to :math:`\pi_\mathrm{ref}`'s), and its point on the reward–KL frontier, proxy and gold. Moving
the slider swaps the bars and moves the two points; nothing is computed in the browser, and no kernel is
needed. :func:`offline_html` turns the figure into the HTML a notebook output carries: a ``<div>`` and the
script that draws into it, with plotly's JavaScript loaded from a path inside the built book (the Sphinx
extension ``tools/plotly_offline.py`` copies ``plotly.min.js`` there), never from a CDN, so the page works
from ``file://`` with the network cut.

The numbers are rounded to ``DIGITS`` (4) significant digits and written as plain JSON lists (not plotly's
base64 arrays), so the output is small (tens of kB) and compares as numbers under nbval.

Shapes: K values of β on the slider, T + 1 possible counts of ``"!"``, M points on the frontier curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._validation import check_nonnegative_int
from .style import PALETTE

__all__ = ["plot_optimum_slider", "offline_html", "OfflineHTML"]

#: Significant digits of every number the figure embeds.
DIGITS = 4
_REF_GREY = "#999999"
_FONT = {"family": "DejaVu Sans, Arial, sans-serif", "size": 13}


def _sig(values: Any, digits: int = DIGITS) -> list:
    """``values`` rounded to ``digits`` significant digits, as (nested) lists of Python floats."""
    arr = np.asarray(values, dtype=float)
    out = np.zeros_like(arr)
    nonzero = arr != 0
    scale = np.floor(np.log10(np.abs(arr[nonzero])))
    factor = 10.0 ** (digits - 1 - scale)
    out[nonzero] = np.round(arr[nonzero] * factor) / factor
    return out.tolist()


def _as_array(x: object, name: str, ndim: int) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array of numbers, got {type(x).__name__}") from None
    if arr.ndim != ndim or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty {ndim}-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _readout(beta: float, kl: float, proxy: float, gold: float) -> str:
    # Two short lines, so that the read-out fits a phone's width too.
    return (f"β = {_sig(beta, 3):g} · KL {kl:.2f} nats<br>proxy reward {proxy:.2f}"
            f" · gold reward {gold:.2f}")


def plot_optimum_slider(
    grid: Any,
    bang_probs: np.ndarray,
    *,
    ref_bang_probs: np.ndarray,
    curve: Any | None = None,
    active: int = 0,
    height: int = 680,
) -> Any:
    """A β slider over the exact optimum :math:`\\pi^*_\\beta`: its "!" counts and its frontier point.

    Top: :math:`P(n_! = k)` under :math:`\\pi_\\mathrm{ref}` (grey) and under :math:`\\pi^*_\\beta`
    (bars that change with the slider). Bottom: the exact frontier, expected proxy and gold reward against
    :math:`\\mathrm{KL}(\\pi^*_\\beta \\| \\pi_\\mathrm{ref})`, with the point of the slider's β marked on
    each. A line above the panels reads out β, the KL and both rewards.

    Parameters
    ----------
    grid : ToyFrontier
        The slider's β values and their exact ``kl``, ``proxy``, ``gold``, each shape (K,), from
        :func:`kltutorial.toyrlhf.exact_frontier`.
    bang_probs : ndarray, shape (K, T + 1)
        :math:`P(n_! = k)` under :math:`\\pi^*_\\beta` for each β of ``grid``
        (:func:`kltutorial.toyrlhf.bang_count_distribution`).
    ref_bang_probs : ndarray, shape (T + 1,)
        The same under :math:`\\pi_\\mathrm{ref}`.
    curve : ToyFrontier, optional
        A denser frontier for the two lines (shape (M,)); default ``grid``.
    active : int
        Index of the β shown first.
    height : int
        Height of the figure in pixels (its width follows the page).

    Returns
    -------
    plotly.graph_objects.Figure
        Traces: 0 the reference bars, 1 the bars of :math:`\\pi^*_\\beta`, 2 and 3 the proxy and gold
        lines, 4 and 5 the proxy and gold points. Slider step k restyles traces 1, 4 and 5.
    """
    betas = _as_array(grid.betas, "grid.betas", 1)
    K = betas.shape[0]
    kl, proxy, gold = (_as_array(getattr(grid, k), f"grid.{k}", 1) for k in ("kl", "proxy", "gold"))
    if not kl.shape == proxy.shape == gold.shape == (K,):
        raise ValueError(f"grid: kl, proxy and gold must have the shape of betas, ({K},)")
    bangs = _as_array(bang_probs, "bang_probs", 2)
    ref = _as_array(ref_bang_probs, "ref_bang_probs", 1)
    if bangs.shape[0] != K or bangs.shape[1] != ref.shape[0]:
        raise ValueError(f"bang_probs must have shape ({K}, {ref.shape[0]}), one row per β of grid, "
                         f"got {bangs.shape}")
    active = check_nonnegative_int(active, "active")
    if active >= K:
        raise ValueError(f"active must be an index into grid.betas, 0 to {K - 1}, got {active}")
    line = grid if curve is None else curve
    order = np.argsort(_as_array(line.kl, "curve.kl", 1))
    counts = list(range(ref.shape[0]))

    # One panel above the other, each as wide as the page: the figure reads the same on a phone.
    fig = make_subplots(rows=2, cols=1, row_heights=[0.38, 0.62], vertical_spacing=0.14,
                        subplot_titles=("number of “!” per sequence", "expected reward against KL"))
    fig.add_trace(go.Bar(x=counts, y=_sig(ref), name="π_ref", marker_color=_REF_GREY,
                         legend="legend"), 1, 1)
    fig.add_trace(go.Bar(x=counts, y=_sig(bangs[active]), name="π*_β", marker_color=PALETTE[4],
                         marker_pattern_shape="/", legend="legend"), 1, 1)
    for key, color, dash in (("proxy", PALETTE[0], "solid"), ("gold", PALETTE[1], "dash")):
        fig.add_trace(go.Scatter(x=_sig(np.asarray(line.kl)[order]),
                                 y=_sig(np.asarray(getattr(line, key))[order]), mode="lines",
                                 name=f"{key} reward", line={"color": color, "dash": dash},
                                 legend="legend2"), 2, 1)
    for values, color, symbol in ((proxy, PALETTE[0], "circle"), (gold, PALETTE[1], "square")):
        fig.add_trace(go.Scatter(x=_sig([kl[active]]), y=_sig([values[active]]), mode="markers",
                                 showlegend=False, marker={"color": color, "size": 13, "symbol": symbol,
                                                           "line": {"color": "black", "width": 1}}), 2, 1)

    steps = []
    for k in range(K):
        restyle = {"y": [_sig(bangs[k]), _sig([proxy[k]]), _sig([gold[k]])],
                   "x": [counts, _sig([kl[k]]), _sig([kl[k]])]}
        steps.append({"method": "update", "label": f"{_sig(betas[k], 2):g}",
                      "args": [restyle, {"title.text": _readout(betas[k], kl[k], proxy[k], gold[k])},
                               [1, 4, 5]]})
    # Each legend in a corner of its panel where nothing is drawn at any β: the bars stay below 0.7
    # (top right), and below the proxy curve's start at KL 0 the frontier's bottom left is empty.
    box = {"bgcolor": "rgba(255,255,255,0.8)", "font": {"size": 12}}
    fig.update_layout(
        template="none", height=height, autosize=True, font=_FONT, barmode="group",
        margin={"l": 60, "r": 20, "t": 110, "b": 20},
        title={"text": _readout(betas[active], kl[active], proxy[active], gold[active]), "x": 0.5,
               "font": {"size": 14}},
        legend={**box, "x": 1.0, "y": 1.0, "xanchor": "right", "yanchor": "top"},
        legend2={**box, "x": 0.01, "y": fig.layout.yaxis2.domain[0] + 0.01, "xanchor": "left",
                 "yanchor": "bottom"},
        sliders=[{"active": active, "steps": steps, "pad": {"t": 70}, "len": 1.0,
                  "currentvalue": {"prefix": "β = ", "font": {"size": 13}}}],
    )
    fig.update_xaxes(dtick=1, row=1, col=1)  # the panel's title names the axis
    fig.update_yaxes(title_text="probability", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="KL(π*_β ‖ π_ref) (nats)", row=2, col=1)
    fig.update_yaxes(title_text="reward (reward units)", row=2, col=1)
    fig.update_xaxes(showgrid=True, gridcolor="#e5e5e5", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#e5e5e5", zeroline=False)
    return fig


@dataclass(frozen=True)
class OfflineHTML:
    """HTML that a notebook shows as its ``text/html`` output (what ``myst_nb.glue`` stores).

    Attributes
    ----------
    div_id : str
        The ``id`` of the ``<div>`` the figure is drawn into.
    data : str
        The HTML: a container ``<div>``, the ``<script>`` that loads plotly, the figure's ``<div>`` and
        the script that draws it.
    """

    div_id: str
    data: str

    def _repr_html_(self) -> str:
        return self.data

    def __repr__(self) -> str:  # the text/plain output: short, and the same at every run
        return f"<OfflineHTML: interactive figure in div {self.div_id!r}>"


def offline_html(fig: Any, *, div_id: str, plotly_js: str, label: str = "") -> OfflineHTML:
    """The figure as a notebook output that draws itself offline: ``<div>`` + script, no CDN.

    Parameters
    ----------
    fig : plotly.graph_objects.Figure
    div_id : str
        The ``id`` of the ``<div>`` the figure is drawn into: fixed, so the output is the same at every
        run (plotly picks a random one otherwise).
    plotly_js : str
        Path of ``plotly.min.js`` relative to the page that shows the output, e.g.
        ``"../_static/plotly.min.js"`` for a page under ``book/`` (where ``tools/plotly_offline.py``
        puts it in the built book).
    label : str
        Text for screen readers (``aria-label`` of the container).

    Returns
    -------
    OfflineHTML
        Its ``text/html`` is what ``myst_nb.glue`` stores and the book renders.
    """
    if not isinstance(fig, go.Figure):
        raise TypeError(f"fig must be a plotly Figure, got {type(fig).__name__}")
    for name, value in (("div_id", div_id), ("plotly_js", plotly_js)):
        if not isinstance(value, str) or not value or any(c in value for c in "\"'<> "):
            raise ValueError(f"{name} must be a non-empty string without quotes, spaces or brackets, "
                             f"got {value!r}")
    body = fig.to_html(
        full_html=False, include_plotlyjs=plotly_js, div_id=div_id,
        default_height=f"{fig.layout.height}px" if fig.layout.height else "100%",
        config={"displaylogo": False, "responsive": True, "plotlyServerURL": "",
                "modeBarButtonsToRemove": ["toImage", "sendDataToCloud"]},
    )
    escaped = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    html = f'<div class="kltutorial-interactive" role="figure" aria-label="{escaped}">\n{body}\n</div>'
    return OfflineHTML(div_id=div_id, data=html)
