"""Figures of book sections 1 and 2: why the KL penalty, and what the KL divergence is.

* :func:`plot_reward_hacking`: proxy reward up while gold reward falls, over a training run with a
  vanishing β and along the exact optimum :math:`\\pi^*_\\beta` as β shrinks (§1);
* :func:`plot_grouped_bars`: several distributions over the same few categories side by side (where the
  probability mass goes, §1; the optima of the two penalty directions, §2);
* :func:`plot_forward_reverse_fits`: one Gaussian fitted to a two-mode mixture by the forward and by the
  reverse KL, and each KL against the Gaussian's mean (§2).

They take arrays or objects with array attributes (``TrainResult``, ``ToyFrontier``,
:class:`~kltutorial.exact.Gaussian`), never a task or a model, and compute nothing but positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from .style import REFERENCE_COLOR, fig_size, new_axes, new_axes_grid, series_style

__all__ = ["plot_reward_hacking", "plot_grouped_bars", "plot_forward_reverse_fits"]

# Hatches keep bars apart when colour is lost (grayscale print); one per series, in order.
_HATCHES = ("", "//", "..", "xx", "\\\\", "oo", "--")


def _check_mapping(x: object, name: str) -> Mapping[str, Any]:
    if not isinstance(x, Mapping) or len(x) == 0:
        raise TypeError(f"{name}: expected a non-empty dict name -> values, got {type(x).__name__}")
    return x


def plot_reward_hacking(run: Any, frontier: Any, *, axes: Any = None, title: str | None = None) -> np.ndarray:
    """Proxy reward against gold reward as the KL penalty vanishes (§1).

    Left: the expected proxy and gold reward of the policy at every step of one training run. Right:
    the same two rewards of the exact optimum :math:`\\pi^*_\\beta` against β on a log scale, drawn
    with β decreasing to the right (less penalty, more optimisation). A dotted line marks the gold
    reward of the starting policy, :math:`\\pi_\\mathrm{ref}`, on both panels.

    Parameters
    ----------
    run : TrainResult
        ``proxy`` and ``gold`` of shape (n,), exact per step, and ``beta`` (n + 1,): a run with a fixed
        β, which the left title names; its step 0 is :math:`\\pi_\\mathrm{ref}`.
    frontier : ToyFrontier
        ``betas``, ``proxy``, ``gold`` of shape (K,) (from :func:`kltutorial.toyrlhf.exact_frontier`).
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    proxy, gold = np.asarray(run.proxy, dtype=float), np.asarray(run.gold, dtype=float)
    if proxy.ndim != 1 or proxy.shape != gold.shape or proxy.size < 2:
        raise ValueError(f"run: expected proxy and gold of the same shape (n,), n >= 2; got {proxy.shape} "
                         f"and {gold.shape}")
    betas = np.asarray(frontier.betas, dtype=float)
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(3.6), sharey=True)
    ax_run, ax_beta = flat
    steps = np.arange(proxy.shape[0])
    s_proxy, s_gold = series_style(0), series_style(1)
    ref_gold = gold[0]
    for ax in flat:
        ax.axhline(ref_gold, color=REFERENCE_COLOR, linestyle=":", linewidth=1.2,
                   label="gold reward of π_ref")
    every = max(proxy.shape[0] // 10, 1)
    ax_run.plot(steps, proxy, color=s_proxy["color"], linestyle=s_proxy["linestyle"],
                marker=s_proxy["marker"], markevery=every, label="proxy (what training sees)")
    ax_run.plot(steps, gold, color=s_gold["color"], linestyle=s_gold["linestyle"],
                marker=s_gold["marker"], markevery=every, label="gold (what we want)")
    ax_run.set_xlabel("training step")
    ax_run.set_ylabel("expected reward (reward units)")
    ax_run.set_title(f"a training run, β = {float(run.beta[0]):g}")
    ax_run.legend(loc="lower left", fontsize=8.5)
    order = np.argsort(-betas)  # large beta first: the x axis is inverted below anyway
    every_b = max(betas.shape[0] // 10, 1)
    ax_beta.plot(betas[order], np.asarray(frontier.proxy, dtype=float)[order], color=s_proxy["color"],
                 linestyle=s_proxy["linestyle"], marker=s_proxy["marker"], markevery=every_b,
                 label="proxy")
    ax_beta.plot(betas[order], np.asarray(frontier.gold, dtype=float)[order], color=s_gold["color"],
                 linestyle=s_gold["linestyle"], marker=s_gold["marker"], markevery=every_b, label="gold")
    ax_beta.set_xscale("log")
    ax_beta.invert_xaxis()
    ax_beta.set_xlabel("β (reward units per nat, log scale; smaller →)")
    ax_beta.set_title("the exact optimum π*_β as β → 0")
    if title:
        ax_run.figure.suptitle(title)
    return flat


def plot_grouped_bars(
    distributions: Mapping[str, np.ndarray],
    categories: Sequence[str],
    *,
    xlabel: str,
    ylabel: str = "probability",
    ax: Axes | None = None,
    title: str | None = None,
    height: float = 3.4,
) -> Axes:
    """Grouped bars: the probability each distribution gives each category (§1, §2).

    Parameters
    ----------
    distributions : dict name -> ndarray, shape (C,)
        One bar series per entry, in order; series i gets the colour of :func:`~.style.series_style`
        ``(i)`` and its own hatch, so that the series stay apart in grayscale.
    categories : sequence of str, length C
        The tick label of each group.
    xlabel, ylabel : str
    ax : Axes, optional
    title : str, optional
    height : float
        Figure height in inches when ``ax`` is None (the width is the house width).

    Returns
    -------
    Axes
    """
    distributions = _check_mapping(distributions, "distributions")
    labels = list(categories)
    values = [np.asarray(v, dtype=float) for v in distributions.values()]
    if any(v.shape != (len(labels),) for v in values):
        raise ValueError(f"distributions: every entry must have shape ({len(labels)},), one value per "
                         f"category; got {[v.shape for v in values]}")
    ax = new_axes(ax, figsize=fig_size(height))
    n = len(values)
    width = 0.8 / n
    x = np.arange(len(labels))
    for i, (name, v) in enumerate(zip(distributions, values, strict=True)):
        ax.bar(x - 0.4 + width * (i + 0.5), v, width=width, color=series_style(i)["color"],
               hatch=_HATCHES[i % len(_HATCHES)], edgecolor="white", linewidth=0.3, label=name)
    ax.set_xticks(x, labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0.0, 1.0)
    ax.legend(loc="upper left", fontsize=8.5)
    if title:
        ax.set_title(title)
    return ax


def plot_forward_reverse_fits(
    p: Any,
    forward: Any,
    reverse: Mapping[str, Any],
    x: np.ndarray,
    *,
    forward_profile: tuple[np.ndarray, np.ndarray],
    reverse_profile: tuple[np.ndarray, np.ndarray],
    kl_max: float | None = None,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """One Gaussian fitted to a two-mode mixture both ways (§2).

    Left: the density of the mixture :math:`p` (black, shaded), of the forward fit
    :math:`\\arg\\min_q \\mathrm{KL}(p \\| q)` and of each reverse fit :math:`\\arg\\min_q \\mathrm{KL}(q
    \\| p)`. Right: each KL against the mean of :math:`q`, its width chosen best for each mean
    (:func:`kltutorial.exact.kl_profile`), with each fit marked on the curve of its direction.

    Parameters
    ----------
    p : GaussianMixture
        Anything with ``pdf(x)``.
    forward : Gaussian
        The forward fit (``mean``, ``std``, ``pdf``); series style 0.
    reverse : dict name -> Gaussian
        Reverse fits, e.g. one per start; series styles 1, 2, ...
    x : ndarray, shape (M,)
        Where to draw the densities.
    forward_profile, reverse_profile : (means, kl), each ndarray of shape (L,)
        The two profiles from :func:`~kltutorial.exact.kl_profile`.
    kl_max : float, optional
        Top of the KL axis; by default four times the largest KL of a fit, so that the profiles' steep
        walls do not squash their minima.
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    reverse = _check_mapping(reverse, "reverse")
    x = np.asarray(x, dtype=float)
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(3.6))
    ax_d, ax_p = flat
    dens = p.pdf(x)
    ax_d.fill_between(x, dens, color="0.85", linewidth=0)
    ax_d.plot(x, dens, color="black", linewidth=2.2, label="p: the two-mode mixture")
    every = max(x.shape[0] // 12, 1)
    fits = [("forward: argmin KL(p ‖ q)", forward)] + [(f"reverse, {k}", v) for k, v in reverse.items()]
    for i, (label, g) in enumerate(fits):
        st = series_style(i)
        ax_d.plot(x, g.pdf(x), color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                  markevery=(i * every // 3, every), markersize=4, label=label)
    ax_d.set_xlabel("x")
    ax_d.set_ylabel("density (per unit of x)")
    ax_d.set_title("the densities")
    ax_d.legend(loc="upper left", fontsize=8)
    profiles = {"forward": forward_profile, "reverse": reverse_profile}
    profile_styles = {"forward": series_style(0), "reverse": series_style(1)}
    names = {"forward": "KL(p ‖ q)", "reverse": "KL(q ‖ p)"}
    for key, (means, kl) in profiles.items():
        means, kl = np.asarray(means, dtype=float), np.asarray(kl, dtype=float)
        st = profile_styles[key]
        ax_p.plot(means, kl, color=st["color"], linestyle=st["linestyle"], label=names[key])
    at_fit = []
    for i, (_, g) in enumerate(fits):
        means, kl = (np.asarray(a, dtype=float) for a in profiles["forward" if i == 0 else "reverse"])
        st = series_style(i)
        at_fit.append(float(np.interp(g.mean, means, kl)))
        ax_p.plot([g.mean], [at_fit[-1]], color=st["color"], marker=st["marker"],
                  markersize=8, markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
    ax_p.set_ylim(0.0, kl_max if kl_max is not None else 4 * max(at_fit))
    ax_p.set_xlabel("mean μ of q (its width best for each μ)")
    ax_p.set_ylabel("KL (nats)")
    ax_p.set_title("each KL against q's mean (markers: the fits)")
    ax_p.legend(loc="upper center", fontsize=8.5)
    if title:
        ax_d.figure.suptitle(title)
    return flat
