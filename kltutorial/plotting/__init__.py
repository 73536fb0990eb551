"""The book's figures: one house style (:mod:`.style`) and one module per family of figures.

=================  ==============================================================================  ========
module             figures                                                                         sections
=================  ==============================================================================  ========
``style``          palette, line styles, :func:`use_style`, figure width, β colours, median bands  all
``foundations``    reward hacking, grouped bars, forward against reverse KL fits                   1, 2
``estimation``     Monte Carlo convergence of the sequence KL, estimators' distributions           3, 4
``objective``      the exact frontier with its tangents, perturbation gaps                         5
``beta``           β sweeps                                                                        6
``control_study``  step response, gain sweep, the rules on one plant                               7
``controllers``    controller dynamics; the 2 x 2 KL / β / reward / penalised layout               8, 10, 11
``dynamics``       reward vs KL per β, KL over steps, per-token KL patterns                        10
``experiment``     frontier, "!" histogram, data sweep, toy controllers, token KL, fixed points,   9, 11
                   TRL's kl beside the exact KL
``interactive``    the β slider over π*_β (plotly, offline)                                        11
``diagnostics``    per-token KL heat maps, KL spike logs, memory against the vocabulary size       12
``text``           real-text runs over training, the learned proxy over-optimised, words shaded    11b
                   by their KL
=================  ==============================================================================  ========

Plot functions take results (arrays, result dataclasses, controller histories), draw on an
optional ``ax``/``axes`` and return what they drew on. They never train, sample or call
``plt.show()``, and they draw quantities the results hold rather than computing new ones:
computing lives in the other modules of :mod:`kltutorial`, drawing lives here.

Use it as ``from kltutorial import plotting; plotting.use_style(); plotting.plot_reward_vs_kl(...)``.
"""

from .beta import (
    plot_beta_sweep,
)
from .control_study import (
    plot_gain_sweep,
    plot_rules_on_plant,
    plot_step_response,
)
from .controllers import (
    ControlTrace,
    plot_control_panels,
    plot_controller_dynamics,
    plot_fixed_vs_adaptive,
)
from .diagnostics import (
    HEATMAP_CMAP,
    plot_memory_by_vocab,
    plot_spike_log,
    plot_token_kl_heatmap,
)
from .dynamics import (
    plot_kl_over_steps,
    plot_reward_vs_kl,
    plot_token_kl_patterns,
)
from .estimation import (
    plot_estimator_distributions,
    plot_kl_convergence,
)
from .experiment import (
    plot_bang_histogram,
    plot_data_sweep,
    plot_gao_fits,
    plot_recipe_fixed_points,
    plot_toy_controllers,
    plot_toy_frontier,
    plot_toy_token_kl,
    plot_training_paths,
    plot_trl_kl,
)
from .foundations import (
    plot_forward_reverse_fits,
    plot_grouped_bars,
    plot_reward_hacking,
)
from .interactive import (
    OfflineHTML,
    offline_html,
    plot_optimum_slider,
)
from .objective import (
    plot_frontier_tangents,
    plot_perturbation_gaps,
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
    check_quantiles,
    fig_size,
    figure_legend_below,
    legend_below,
    log_beta_axis,
    new_axes,
    new_axes_grid,
    plot_median_band,
    save_figure,
    series_style,
    use_style,
)
from .text import (
    plot_logged_kl_estimates,
    plot_position_kl,
    plot_text_overoptimisation,
    plot_text_runs,
    plot_token_kl_text,
    plot_trl_text_run,
    word_label,
)

__all__ = [
    "FIG_WIDTH",
    "fig_size",
    "PALETTE",
    "LINESTYLES",
    "MARKERS",
    "REFERENCE_COLOR",
    "ZONE_COLOR",
    "use_style",
    "save_figure",
    "legend_below",
    "figure_legend_below",
    "series_style",
    "beta_colors",
    "beta_styles",
    "new_axes",
    "new_axes_grid",
    "log_beta_axis",
    "check_quantiles",
    "plot_median_band",
    "plot_reward_hacking",
    "plot_grouped_bars",
    "plot_forward_reverse_fits",
    "plot_kl_convergence",
    "plot_estimator_distributions",
    "plot_frontier_tangents",
    "plot_perturbation_gaps",
    "plot_beta_sweep",
    "plot_step_response",
    "plot_gain_sweep",
    "plot_rules_on_plant",
    "ControlTrace",
    "plot_control_panels",
    "plot_controller_dynamics",
    "plot_fixed_vs_adaptive",
    "plot_reward_vs_kl",
    "plot_kl_over_steps",
    "plot_token_kl_patterns",
    "plot_toy_frontier",
    "plot_bang_histogram",
    "plot_data_sweep",
    "plot_toy_controllers",
    "plot_toy_token_kl",
    "plot_training_paths",
    "plot_gao_fits",
    "plot_recipe_fixed_points",
    "plot_trl_kl",
    "plot_optimum_slider",
    "offline_html",
    "OfflineHTML",
    "HEATMAP_CMAP",
    "plot_token_kl_heatmap",
    "plot_memory_by_vocab",
    "plot_spike_log",
    "plot_text_runs",
    "plot_text_overoptimisation",
    "plot_token_kl_text",
    "plot_trl_text_run",
    "plot_position_kl",
    "plot_logged_kl_estimates",
    "word_label",
]
