"""The book's figures: one house style (:mod:`.style`) and one module per family of figures.

=====================  ===================================================================  ========
module                 figures                                                              sections
=====================  ===================================================================  ========
``style``              palette, line styles, :func:`use_style`, β colours, median bands     all
``controllers``        controller dynamics; the 2 x 2 KL / β / reward / penalised layout    8, 10, 11
``dynamics``           reward vs KL per β, KL over steps, per-token KL patterns             10
``experiment``         frontier, "!" histogram, data sweep, toy controllers, token KL       11
=====================  ===================================================================  ========

Plot functions take results (arrays, result dataclasses, controller histories), draw on an
optional ``ax``/``axes`` and return what they drew on. They never train, sample or call
``plt.show()``, and they draw quantities the results hold rather than computing new ones:
computing lives in the other modules of :mod:`kltutorial`, drawing lives here.

Use it as ``from kltutorial import plotting; plotting.use_style(); plotting.plot_reward_vs_kl(...)``.
"""

from .controllers import (
    ControlTrace,
    plot_control_panels,
    plot_controller_dynamics,
    plot_fixed_vs_adaptive,
)
from .dynamics import plot_kl_over_steps, plot_reward_vs_kl, plot_token_kl_patterns
from .experiment import (
    plot_bang_histogram,
    plot_data_sweep,
    plot_toy_controllers,
    plot_toy_frontier,
    plot_toy_token_kl,
)
from .style import (
    FIG_WIDTH,
    LINESTYLES,
    MARKERS,
    PALETTE,
    REFERENCE_COLOR,
    ZONE_COLOR,
    beta_colors,
    beta_styles,
    fig_size,
    plot_median_band,
    series_style,
    use_style,
)

__all__ = [
    "FIG_WIDTH",
    "fig_size",
    # house style (style.py)
    "PALETTE",
    "LINESTYLES",
    "MARKERS",
    "REFERENCE_COLOR",
    "ZONE_COLOR",
    "use_style",
    "series_style",
    "beta_colors",
    "beta_styles",
    "plot_median_band",
    # controllers at work, §8, §10, §11 (controllers.py)
    "ControlTrace",
    "plot_control_panels",
    "plot_controller_dynamics",
    "plot_fixed_vs_adaptive",
    # §10 invented dynamics (dynamics.py)
    "plot_reward_vs_kl",
    "plot_kl_over_steps",
    "plot_token_kl_patterns",
    # §11 the real experiment (experiment.py)
    "plot_toy_frontier",
    "plot_bang_histogram",
    "plot_data_sweep",
    "plot_toy_controllers",
    "plot_toy_token_kl",
]
