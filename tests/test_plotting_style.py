"""Tests of kltutorial.plotting.style (the house style) and of the package's public names."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb

from kltutorial import plotting
from kltutorial.plotting import style


def _lightness(color):
    r, g, b = to_rgb(color)
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_every_figure_function_is_reexported():
    modules = [importlib.import_module(f"kltutorial.plotting.{info.name}")
               for info in pkgutil.iter_modules(plotting.__path__)]
    assert len(plotting.__all__) == len(set(plotting.__all__))
    for name in plotting.__all__:
        assert hasattr(plotting, name), name
    for name in plotting.__all__:  # each name comes from one of the modules
        assert any(getattr(m, name, None) is getattr(plotting, name) for m in modules), name
    for module in modules:  # every figure is reachable as plotting.plot_xxx
        for name in module.__all__:
            assert getattr(plotting, name) is getattr(module, name), (module.__name__, name)
        # every public plot function of a figure module is listed in its __all__
        public = {n for n, f in inspect.getmembers(module, inspect.isfunction)
                  if n.startswith("plot_") and f.__module__ == module.__name__}
        assert public <= set(module.__all__), module.__name__


def test_use_style_sets_rcparams():
    plotting.use_style()
    rc = matplotlib.rcParams
    assert rc["axes.spines.top"] is False and rc["axes.spines.right"] is False
    assert rc["axes.grid"] is True and rc["figure.dpi"] == 110
    cycle = rc["axes.prop_cycle"].by_key()
    assert len(set(cycle["linestyle"])) > 1  # series differ in grayscale too


def test_beta_colors_warm_to_cool_and_grayscale_ordered():
    betas = [1.0, 0.01, 0.1, 0.05, 0.3]
    colors = plotting.beta_colors(betas)
    assert len(colors) == 5
    order = np.argsort(betas)
    light = [_lightness(colors[i]) for i in order]
    assert all(a > b for a, b in zip(light, light[1:], strict=False))  # darker as β grows
    lo, hi = to_rgb(colors[order[0]]), to_rgb(colors[order[-1]])
    assert lo[0] > lo[2] and hi[2] > hi[0]  # small β warm (red > blue), large β cool
    assert plotting.beta_colors([0.2, 0.2]) == plotting.beta_colors([0.2]) * 2
    styles = plotting.beta_styles(betas)
    assert len({s["linestyle"] if isinstance(s["linestyle"], str) else str(s["linestyle"])
                for s in styles}) == 5


def test_series_styles_differ_in_colour_line_and_marker():
    first = [plotting.series_style(i) for i in range(len(plotting.PALETTE))]
    for key in ("color", "marker"):
        assert len({s[key] for s in first}) == len(first)
    assert plotting.series_style(len(plotting.PALETTE)) == plotting.series_style(0)  # cycles


def test_median_band_validates():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="band"):
        plotting.plot_median_band(ax, np.arange(3), np.ones((2, 3)), band=(0.9, 0.1))
    with pytest.raises(ValueError, match="samples"):
        plotting.plot_median_band(ax, np.arange(3), np.ones((2, 4)))
    plotting.plot_median_band(ax, np.arange(3), np.arange(6.0).reshape(2, 3), label="x")
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [1.5, 2.5, 3.5])


def test_median_band_spans_the_quantiles():
    fig, ax = plt.subplots()
    samples = np.arange(11.0)[:, None] * np.ones((1, 4))  # 0..10 in every column
    plotting.plot_median_band(ax, np.arange(4), samples, band=(0.1, 0.9))
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(1.0) and ys.max() == pytest.approx(9.0)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), 5.0)


def test_new_axes_grid_checks_the_count():
    fig, axes = plt.subplots(1, 3)
    with pytest.raises(ValueError, match="axes"):
        style.new_axes_grid(axes, 2, 2)
    assert style.new_axes_grid(axes, 1, 3)[2] is axes[2]


def test_save_figure_writes_the_png_the_figure_directive_shows(tmp_path, house_style) -> None:
    from PIL import Image

    fig, ax = plt.subplots(figsize=plotting.fig_size(3.0))
    ax.plot([0, 1], [0, 1])
    path = plotting.save_figure(fig, "fig-test-line", folder=tmp_path / "figures")
    first = path.read_bytes()
    assert path == tmp_path / "figures" / "fig-test-line.png" and first.startswith(b"\x89PNG")
    width, _ = Image.open(path).size
    # cropped to its content plus matplotlib's 0.1-inch pad, at the figure's 110 dpi (the column's
    # width in pixels), not savefig's 150
    assert 0.85 * plotting.FIG_WIDTH * 110 < width <= (plotting.FIG_WIDTH + 0.2) * 110 + 1
    assert b"Matplotlib version" not in first
    plotting.save_figure(fig, "fig-test-line", folder=tmp_path / "figures")
    assert path.read_bytes() == first  # the same figure rewrites the same bytes
    plt.close(fig)


@pytest.mark.parametrize(("args", "error", "message"), [
    (("not a figure", "fig-x"), TypeError, "fig must be a matplotlib Figure, got str"),
    ((None, "Fig X"), ValueError, "name must be lower-case words joined by hyphens"),
    ((None, "fig_x.png"), ValueError, "got 'fig_x.png'"),
    ((None, "fig-x", 3), TypeError, "folder must be a str or Path, got int"),
])
def test_save_figure_refuses_bad_arguments(args, error, message) -> None:
    fig = plt.figure()
    args = tuple(fig if a is None else a for a in args)
    with pytest.raises(error, match=message):
        plotting.save_figure(*args)
    plt.close(fig)


def test_legend_below_sits_under_the_tick_labels_and_x_label(house_style) -> None:
    fig, ax = plt.subplots(figsize=plotting.fig_size(3.0))
    ax.plot([1, 10, 100], [1, 2, 3], label="a series")
    ax.set_xscale("log")
    ax.set_xlabel("samples")
    fig.canvas.draw()
    legend = ax.legend(**plotting.legend_below(ax))
    fig.canvas.draw()
    box, axis = legend.get_window_extent(), ax.xaxis.get_tightbbox()
    assert box.y1 <= axis.y0 + 1  # under the x label, not over the data
    assert box.x0 >= 0 and box.y0 >= 0  # and inside the figure (constrained layout made room)
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes, got Figure"):
        plotting.legend_below(fig)
    plt.close(fig)
