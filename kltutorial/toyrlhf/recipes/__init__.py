r"""The recipes readers run, trained on the toy task, and the exact point each one stops at (book section 9).

``train_recipe(task, name, TrainConfig(beta=b), generator=g)`` trains one of :data:`RECIPES` and
:func:`recipe_fixed_point` gives where its expected gradient vanishes. One small module per algorithm,
each built from the library's functions (per-token KL from the estimators' registry,
:func:`~kltutorial.shape_rewards`, :func:`~kltutorial.exact.placement.gae_advantages`):

================  =========================================================================================
``common``        the sampled batch, the clipped surrogate, the optimiser and schedule, the loop, the result
``ppo``           PPO, the KL in the reward (k1, or TRL's k3 option)
``rloo``          REINFORCE leave-one-out, the sequence's k1 in its reward
``grpo``          GRPO and Dr. GRPO, the KL in the loss (k3, k2, k3+, k1)
``registry``      the names, their algorithm, estimator, placement and fixed point
``fixed_points``  each recipe's exact fixed point and its exact expected gradient
================  =========================================================================================

``reinforce-k1-reward`` is :func:`~kltutorial.toyrlhf.train_policy`, unchanged.

The KL's importance weight when a batch is reused for several epochs: with the KL in the reward (PPO,
RLOO, REINFORCE) it is part of the advantage and weighted, like the score, by the clipped ratio; with the KL
in the loss (GRPO family) by nothing (TRL's default, verl, OpenRLHF) or, with ``kl_weight="ratio"``, by the
unclipped ratio (TRL's ``use_bias_correction_kl``), whose gradient turns k3's per-token forward KL into the
reverse one (:mod:`~kltutorial.toyrlhf.recipes.grpo`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ... import exact as ex
from ..._validation import check_choice, check_generator, check_positive_int
from ..config import TrainConfig
from ..task import ToyTask, check_task
from ..trainer import train_policy
from .common import RecipeResult, make_optimizer, run_loop
from .fixed_points import (
    FixedPointCurve,
    expected_gradient,
    fixed_point_curve,
    fixed_point_table,
    group_advantage_curve,
    kl_to_fixed_points,
    recipe_fixed_point,
    score_std,
)
from .grpo import GRPOSettings, grpo_update
from .ppo import PPOSettings, ppo_update
from .registry import RECIPES, RecipeSpec, get_recipe
from .rloo import RLOOSettings, rloo_update

__all__ = [
    "RECIPES",
    "POLICIES",
    "RecipeSpec",
    "RecipeResult",
    "PPOSettings",
    "RLOOSettings",
    "GRPOSettings",
    "get_recipe",
    "train_recipe",
    "recipe_fixed_point",
    "kl_to_fixed_points",
    "fixed_point_table",
    "expected_gradient",
    "score_std",
    "group_advantage_curve",
    "FixedPointCurve",
    "fixed_point_curve",
    "with_reference",
    "batch_gradients",
]

#: The policies :func:`train_recipe` trains: the table (every policy representable) and a small transformer.
POLICIES: tuple[str, ...] = ("table", "transformer")

_UPDATES = {"ppo": ppo_update, "rloo": rloo_update, "grpo": grpo_update}


def with_reference(task: ToyTask, ref_table: torch.Tensor) -> ToyTask:
    """The same task with another reference policy (e.g. a network fitted to the chain), so that every
    exact quantity of a run, :math:`\\pi^*_\\beta` included, is taken against the policy the run starts from.

    ``ref_initial`` and ``ref_transition`` stay those of the chain.
    """
    task = check_task(task)
    table = ex.next_token_logprobs(task.space, ex.sequence_logprobs(task.space, ref_table))
    token = table[task.space.prefix_ids, task.space.sequences]  # (V**T, T)
    return dataclasses.replace(task, ref_table=table, ref_token_logprobs=token, ref_logprobs=token.sum(-1))


def _check_settings(spec: RecipeSpec, settings: object | None, config: TrainConfig) -> Any:
    if spec.settings is None:
        if settings is not None:
            raise ValueError(f"{spec.name} takes no settings (TrainConfig configures it), got {settings!r}")
        return None
    if settings is None:
        settings = spec.settings
    if type(settings) is not type(spec.settings):
        raise TypeError(
            f"settings of {spec.name} must be a {type(spec.settings).__name__} (e.g. "
            f"dataclasses.replace(get_recipe({spec.name!r}).settings, ...)), got {type(settings).__name__}"
        )
    fixed = {"estimator": spec.estimator, "scale_by_std": spec.std_scaled}
    if hasattr(spec.settings, "kl_weight"):  # grpo-k3ratio-loss is GRPO with kl_weight="ratio"
        fixed["kl_weight"] = spec.settings.kl_weight
    for name, want in fixed.items():
        if hasattr(settings, name) and getattr(settings, name) != want:
            got = getattr(settings, name)
            raise ValueError(f"{spec.name} has {name}={want!r} by definition; got {got!r}")
    B = config.batch_size
    for name in ("group_size", "minibatches"):
        n = getattr(settings, name, 1)
        if B % n:
            raise ValueError(f"TrainConfig.batch_size ({B}) must be a multiple of {name} ({n})")
    return settings


def _policy(
    task: ToyTask, policy: str | torch.nn.Module, generator: torch.Generator
) -> tuple[torch.nn.Module, ToyTask]:
    """The policy module and the task whose reference it starts from."""
    from ..policy import TablePolicy
    from ..transformer import TransformerPolicy, fit_reference

    if isinstance(policy, torch.nn.Module):
        if not all(callable(getattr(policy, name, None)) for name in ("table", "values")):
            raise TypeError(
                "policy must be 'table', 'transformer' or a module with forward(sequences), "
                f"values(sequences) and table(), like TransformerPolicy; got {type(policy).__name__}"
            )
        net = policy
    else:
        check_choice(policy, "policy", POLICIES)
        if policy == "table":
            return TablePolicy(task), task
        net = TransformerPolicy(task.space, generator=generator)
        fit_reference(net, task.ref_table)
    with torch.no_grad():
        return net, with_reference(task, net.table())


class _FirstGradient:
    """An optimiser stand-in: keeps the gradient of the first step it is asked to take, moves nothing."""

    def __init__(self, param: torch.nn.Parameter) -> None:
        self.param, self.grad = param, None

    def zero_grad(self) -> None:
        self.param.grad = None

    def step(self) -> None:
        if self.grad is None:
            self.grad = self.param.grad.detach().clone()


def batch_gradients(
    task: ToyTask, recipe: str, beta: float, table: torch.Tensor, *, batch_size: int, batches: int,
    generator: torch.Generator,
) -> torch.Tensor:
    r"""The gradient of ``recipe``'s first update step on each of ``batches`` batches sampled from the table
    policy with next-token log-probs ``table`` (P, V), with respect to its logit table; shape
    (batches, P, V). Their mean tends to the expected gradient, their spread is the sampling noise that the
    optimiser sees at that policy (PPO's critic starts at 0).
    """
    task = check_task(task)
    spec = get_recipe(recipe)
    if spec.algorithm == "reinforce":
        raise ValueError(
            "batch_gradients covers the recipes of recipes/ (REINFORCE's trainer is train_policy)"
        )
    from ..policy import TablePolicy
    from .common import sample_batch

    config = TrainConfig(beta=beta, batch_size=batch_size)
    settings = _check_settings(spec, None, config)
    policy = TablePolicy(task)
    with torch.no_grad():
        policy.theta.copy_(table - task.ref_table)
    grads = []
    for _ in range(check_positive_int(batches, "batches")):
        recorder = _FirstGradient(policy.theta)
        _UPDATES[spec.algorithm](policy, recorder, sample_batch(task, policy, batch_size, generator), beta,
                                 settings, generator)
        grads.append(recorder.grad)
    return torch.stack(grads)


def train_recipe(
    task: ToyTask,
    recipe: str,
    config: TrainConfig,
    *,
    generator: torch.Generator,
    policy: str = "table",
    settings: object | None = None,
    record_every: int = 20,
    progress: bool = False,
) -> RecipeResult:
    r"""Train ``recipe`` on the toy task's proxy reward at a fixed :math:`\beta`.

    Parameters
    ----------
    task : ToyTask
    recipe : str
        One of :data:`RECIPES`.
    config : TrainConfig
        :math:`\beta` (required, > 0), steps, batch size (a multiple of the group size and of the number of
        minibatches) and Adam's learning rate, which decays linearly to 0 over the second half.
    generator : torch.Generator
        Draws every batch, shuffles the minibatches, and initialises a neural policy.
    policy : {"table", "transformer"} or torch.nn.Module
        The table policy (:class:`~kltutorial.toyrlhf.policy.TablePolicy`), or a small transformer
        (:class:`~kltutorial.toyrlhf.transformer.TransformerPolicy`) first fitted to the reference chain
        (:func:`~kltutorial.toyrlhf.transformer.fit_reference`); the fitted network is then the run's
        reference (the result's ``task``). A module (e.g. a transformer fitted once and copied for several
        runs) is trained in place, its table at the start being the reference. A neural policy needs a
        learning rate of its own (``TrainConfig(lr=...)``; 0.1 is the table's).
    settings : PPOSettings, RLOOSettings or GRPOSettings, optional
        The algorithm's own settings (default: the recipe's, ``get_recipe(recipe).settings``); the estimator
        and GRPO's std scaling are part of the recipe and cannot be changed here.
    record_every : int
        Record the exact KL and rewards every this many steps.
    progress : bool
        Show a tqdm bar.

    Returns
    -------
    RecipeResult

    Examples
    --------
    >>> import numpy as np
    >>> from kltutorial import toyrlhf as toy
    >>> task = toy.make_task(toy.TaskConfig(), rng=np.random.default_rng(0),
    ...                      data_rng=np.random.default_rng([0, 100, 0]))
    >>> run = train_recipe(task, "dr-grpo-k2-loss", toy.TrainConfig(beta=0.3, steps=30, batch_size=256),
    ...                    generator=torch.Generator().manual_seed(0))
    >>> target = recipe_fixed_point(task, "dr-grpo-k2-loss", 0.3)
    >>> ex.sequence_kl(run.logprobs, target) < ex.sequence_kl(task.ref_logprobs, target)
    True
    """
    task = check_task(task)
    spec = get_recipe(recipe)
    if not isinstance(config, TrainConfig):
        raise TypeError(
            f"config must be a TrainConfig (e.g. TrainConfig(beta=0.3)), got {type(config).__name__}"
        )
    if config.beta is None:
        raise ValueError("train_recipe needs a fixed beta: TrainConfig(beta=...) with beta > 0")
    generator = check_generator(generator)
    if not isinstance(policy, torch.nn.Module):
        check_choice(policy, "policy", POLICIES)
    record_every = check_positive_int(record_every, "record_every")
    settings = _check_settings(spec, settings, config)
    group_size = getattr(settings, "group_size", None)

    if spec.algorithm == "reinforce":
        if isinstance(policy, torch.nn.Module) or policy != "table":
            raise ValueError(
                "reinforce-k1-reward trains the table policy only (its critic is a table of prefixes); "
                "ppo-k1-reward is the same penalty with a value head"
            )
        run = train_policy(task, config, generator=generator, progress=progress)
        keep = np.arange(0, config.steps, record_every)
        final = lambda r: ex.expected_reward(run.logprobs, r)  # noqa: E731
        return RecipeResult(
            recipe=spec.name, beta=config.beta, logprobs=run.logprobs, task=task, group_size=None,
            steps=np.append(keep, config.steps),
            kl=np.append(run.kl[keep], ex.sequence_kl(run.logprobs, task.ref_logprobs)),
            proxy=np.append(run.proxy[keep], final(task.proxy_reward)),
            gold=np.append(run.gold[keep], final(task.gold_reward)), settings=None,
        )

    module, run_task = _policy(task, policy, generator)
    opt, sched = make_optimizer(module.parameters(), config)
    step = _UPDATES[spec.algorithm]
    steps, kl, proxy, gold = run_loop(
        run_task, module, config, lambda batch, beta: step(module, opt, batch, beta, settings, generator),
        generator=generator, scheduler=sched, record_every=record_every, progress=progress, desc=spec.name,
    )
    with torch.no_grad():
        logprobs = ex.sequence_logprobs(task.space, module.table())
    return RecipeResult(
        recipe=spec.name, beta=config.beta, logprobs=logprobs, task=run_task, group_size=group_size,
        steps=steps, kl=kl, proxy=proxy, gold=gold, settings=settings,
    )
