"""Tests of kltutorial.plotting.interactive: the β-slider figure of section 11 and its offline HTML.

What the figure holds (traces, slider steps that restyle them, numbers rounded to four significant digits
and written as plain JSON), what the HTML loads (plotly from the given relative path, never a CDN), that it
is the same at every call, and a table of bad inputs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import pytest

from kltutorial.plotting import interactive
from kltutorial.plotting.interactive import OfflineHTML, offline_html, plot_optimum_slider


@dataclass(frozen=True)
class Grid:  # the attributes of toyrlhf.ToyFrontier the figure reads
    betas: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray


GRID = Grid(betas=np.array([2.0, 1.0, 0.5]), kl=np.array([0.1, 0.4, 1.23456789]),
            proxy=np.array([0.2, 0.6, 1.0]), gold=np.array([0.3, 0.5, 0.4]))
BANGS = np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
REF = np.array([0.8, 0.15, 0.05])


def _figure(**kw) -> go.Figure:
    return plot_optimum_slider(GRID, BANGS, ref_bang_probs=REF, **kw)


def test_sig_rounds_to_significant_digits() -> None:
    assert interactive._sig([1.23456, -0.000123456, 0.0, 98765.4]) == [1.235, -0.0001235, 0.0, 98770.0]
    assert interactive._sig(np.array([[1 / 3]]), digits=2) == [[0.33]]


def test_figure_traces_and_slider_steps() -> None:
    fig = _figure(active=1)
    ref_bars, bars, proxy_line, gold_line, proxy_point, gold_point = fig.data
    assert list(ref_bars.y) == REF.tolist() and list(bars.y) == BANGS[1].tolist()
    assert list(proxy_line.x) == [0.1, 0.4, 1.235] and list(gold_line.y) == GRID.gold.tolist()
    assert (proxy_point.x[0], proxy_point.y[0]) == (0.4, 0.6)
    assert (gold_point.x[0], gold_point.y[0]) == (0.4, 0.5)
    (slider,) = fig.layout.sliders
    assert slider.active == 1 and len(slider.steps) == 3
    for k, step in enumerate(slider.steps):
        restyle, relayout, traces = step.args
        assert list(traces) == [1, 4, 5] and step.method == "update"
        assert restyle["y"][0] == BANGS[k].tolist()
        assert restyle["x"][1] == restyle["x"][2] == interactive._sig([GRID.kl[k]])
        assert relayout["title.text"].startswith(f"β = {GRID.betas[k]:g} · KL ")
    assert [s.label for s in slider.steps] == ["2", "1", "0.5"]
    assert fig.layout.title.text == slider.steps[1].args[1]["title.text"]
    # A denser curve for the lines, drawn in order of KL.
    curve = Grid(betas=GRID.betas[::-1], kl=GRID.kl[::-1], proxy=GRID.proxy[::-1], gold=GRID.gold[::-1])
    assert list(_figure(curve=curve).data[2].x) == interactive._sig(GRID.kl)


def test_numbers_are_plain_json_rounded() -> None:
    text = _figure().to_json()
    assert "bdata" not in text  # plain lists, not plotly's base64 arrays
    assert "1.235" in text and "1.2345" not in text


def test_offline_html_loads_plotly_locally_and_is_deterministic() -> None:
    html = offline_html(_figure(), div_id="fig-test-plot", plotly_js="../_static/plotly.min.js",
                        label='a "slider" <figure>')
    assert isinstance(html, OfflineHTML) and html._repr_html_() == html.data
    assert '<script charset="utf-8" src="../_static/plotly.min.js"></script>' in html.data
    assert 'id="fig-test-plot"' in html.data and 'Plotly.newPlot(' in html.data
    srcs = re.findall(r'<script[^>]*src="([^"]*)"', html.data)
    assert srcs == ["../_static/plotly.min.js"]  # the only script loaded, from the build
    assert "cdn" not in html.data.lower()
    assert 'aria-label="a &quot;slider&quot; &lt;figure>"' in html.data
    again = offline_html(_figure(), div_id="fig-test-plot", plotly_js="../_static/plotly.min.js",
                         label='a "slider" <figure>')
    assert again.data == html.data  # a fixed div id: the same output at every run
    assert repr(html) == "<OfflineHTML: interactive figure in div 'fig-test-plot'>"
    # The embedded figure is the figure: parse the JSON that newPlot receives.
    data = json.loads(re.search(r'Plotly\.newPlot\(\s*"fig-test-plot",\s*(\[.*?\]),\s*\{', html.data,
                                re.S).group(1))
    assert data[1]["y"] == BANGS[0].tolist()


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: plot_optimum_slider(GRID, BANGS[:2], ref_bang_probs=REF), ValueError, "bang_probs must"),
    (lambda: plot_optimum_slider(GRID, BANGS, ref_bang_probs=REF[:2]), ValueError, "bang_probs must"),
    (lambda: plot_optimum_slider(Grid(GRID.betas, GRID.kl[:2], GRID.proxy, GRID.gold), BANGS,
                                 ref_bang_probs=REF), ValueError, "shape of betas"),
    (lambda: plot_optimum_slider(GRID, BANGS * np.nan, ref_bang_probs=REF), ValueError, "NaN"),
    (lambda: plot_optimum_slider(GRID, BANGS[0], ref_bang_probs=REF), ValueError, "2-D"),
    (lambda: plot_optimum_slider(GRID, BANGS, ref_bang_probs=REF, active=3), ValueError, "active must"),
    (lambda: plot_optimum_slider(GRID, BANGS, ref_bang_probs=REF, active=True), TypeError, "active"),
    (lambda: plot_optimum_slider(GRID, "x", ref_bang_probs=REF), TypeError, "bang_probs must"),
    (lambda: offline_html("fig", div_id="a", plotly_js="p.js"), TypeError, "plotly Figure"),
    (lambda: offline_html(_figure(), div_id='a"b', plotly_js="p.js"), ValueError, "div_id"),
    (lambda: offline_html(_figure(), div_id="a", plotly_js=""), ValueError, "plotly_js"),
])
def test_bad_input(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
