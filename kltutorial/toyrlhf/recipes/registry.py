"""The recipes by name: which algorithm, which estimator where, and which fixed point (book section 9).

One :class:`RecipeSpec` per name in :data:`RECIPES`; :func:`get_recipe` looks one up and says what the
names are when it is not there.
"""

from __future__ import annotations

from dataclasses import dataclass

from .grpo import GRPOSettings
from .ppo import PPOSettings
from .rloo import RLOOSettings

__all__ = ["RecipeSpec", "RECIPES", "get_recipe"]

_NO_REGULARISER = (
    "k1's expected gradient in the loss is 0, so only the score moves the policy, towards a deterministic one"
)
_K3_REWARD = (
    "as a reward, k3 grows like pi_ref/pi as a token falls below the reference, so a token pushed down is "
    "pushed down further; its expected gradient is the sequence KL's minus the per-token forward KL's, and "
    "the point where it vanishes repels on both sides (V = 2, T = 1, ref (0.5, 0.5), scores (1, 0), "
    "beta 0.3: pi = (0.079, 0.921))"
)


@dataclass(frozen=True)
class RecipeSpec:
    """A recipe: an algorithm, where its KL goes and with which estimator, and where it stops.

    Attributes
    ----------
    name : str
    algorithm : {"reinforce", "ppo", "rloo", "grpo"}
    placement : {"reward", "loss"}
    estimator : str
        The per-token estimator of the penalty (the estimators' registry).
    settings : object or None
        The algorithm's default settings (None for REINFORCE, configured by ``TrainConfig`` alone).
    fixed_point : {"optimum", "reverse", "forward"} or None
        :math:`\\pi^*_\\beta`, the per-token reverse or forward KL's fixed point, or none.
    std_scaled : bool
        GRPO's division by the group's std.
    why_none : str
        Why there is no stable fixed point, where there is none.
    repels : bool
        Without a stable fixed point: whether a point where the expected gradient vanishes exists and
        pushes the policy away (k3 in the reward), rather than none at all (k1 in the loss).
    summary : str
        One line for ``--help`` and tables.
    """

    name: str
    algorithm: str
    placement: str
    estimator: str
    settings: object | None
    fixed_point: str | None
    summary: str
    std_scaled: bool = False
    why_none: str = ""
    repels: bool = False

    @property
    def stability(self) -> str:
        """``"stable"`` (the run heads for its ``fixed_point``), ``"repels"`` (the expected gradient vanishes
        at a point that pushes the policy away) or ``"none"`` (it vanishes nowhere), for tables.

        Examples
        --------
        >>> [get_recipe(n).stability for n in ("ppo-k1-reward", "ppo-k3-reward", "dr-grpo-k1-loss")]
        ['stable', 'repels', 'none']
        """
        if self.fixed_point is not None:
            return "stable"
        return "repels" if self.repels else "none"

    @property
    def group_setting(self) -> str | None:
        """The settings field that holds the group size, or None for a recipe without a group baseline."""
        return "group_size" if hasattr(self.settings, "group_size") else None


_SPECS = (
    RecipeSpec("reinforce-k1-reward", "reinforce", "reward", "k1", None, "optimum",
               "REINFORCE, per-token k1 shaping, rewards-to-go, a per-prefix Monte-Carlo critic"),
    RecipeSpec("ppo-k1-reward", "ppo", "reward", "k1", PPOSettings(), "optimum",
               "PPO (TRL <= 0.11, OpenRLHF): k1 shaping, GAE from a learned critic, clipped ratio, epochs"),
    RecipeSpec("rloo-k1-reward", "rloo", "reward", "k1", RLOOSettings(), "optimum",
               "REINFORCE leave-one-out over k samples, the sequence's k1 sum in its reward"),
    RecipeSpec("ppo-k3-reward", "ppo", "reward", "k3", PPOSettings(estimator="k3"), None,
               "PPO with TRL's kl_estimator='k3': k3 as the per-token penalty in the reward",
               why_none=_K3_REWARD, repels=True),
    RecipeSpec("grpo-k3-loss", "grpo", "loss", "k3", GRPOSettings(), "forward",
               "GRPO: group advantage (s - mean) / std, clipped ratio, beta * k3 in the loss",
               std_scaled=True),
    RecipeSpec("grpo-k3ratio-loss", "grpo", "loss", "k3", GRPOSettings(kl_weight="ratio"), "reverse",
               "GRPO with TRL 1.16's default use_bias_correction_kl: beta * ratio * k3 in the loss "
               "(the per-token reverse KL's gradient)", std_scaled=True),
    RecipeSpec("dr-grpo-k3-loss", "grpo", "loss", "k3", GRPOSettings(scale_by_std=False), "forward",
               "Dr. GRPO: group advantage s - mean (no std), beta * k3 in the loss"),
    RecipeSpec("dr-grpo-k2-loss", "grpo", "loss", "k2", GRPOSettings(estimator="k2", scale_by_std=False),
               "reverse", "Dr. GRPO with beta * k2 in the loss"),
    RecipeSpec("dr-grpo-k3plus-loss", "grpo", "loss", "k3+",
               GRPOSettings(estimator="k3+", scale_by_std=False), "reverse",
               "Dr. GRPO with verl's straight-through k3+ (k3's value, k2's gradient) in the loss"),
    RecipeSpec("dr-grpo-k1-loss", "grpo", "loss", "k1", GRPOSettings(estimator="k1", scale_by_std=False),
               None,
               "Dr. GRPO with beta * k1 in the loss: expected gradient 0, no regulariser",
               why_none=_NO_REGULARISER),
)

#: The recipe names, in the order of the book's table.
RECIPES: tuple[str, ...] = tuple(spec.name for spec in _SPECS)
_BY_NAME = {spec.name: spec for spec in _SPECS}


def get_recipe(name: object) -> RecipeSpec:
    """The :class:`RecipeSpec` of ``name``; ValueError naming the recipes if there is no such recipe.

    Examples
    --------
    >>> get_recipe("dr-grpo-k2-loss").fixed_point
    'reverse'
    """
    if not isinstance(name, str):
        raise TypeError(f"recipe must be a str, one of {', '.join(RECIPES)}; got {type(name).__name__}")
    if name not in _BY_NAME:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}; got {name!r}")
    return _BY_NAME[name]
