r"""A real RLHF run on an output space small enough to enumerate (book section 11).

Sequences of T = 5 tokens from a vocabulary of V = 8 (``"abcdefg!"``): 8**5 = 32,768 sequences, few
enough that every probability, KL divergence and expected reward of the experiment is computed exactly
by :mod:`kltutorial.exact`, a sum over all of them. Only the training signal is sampled, as in real
RLHF. One idea per module:

===============  ===============================================================================
``config``       :class:`TaskConfig` and :class:`TrainConfig`, frozen and validated
``task``         :func:`make_task`: the reference chain :math:`\pi_\mathrm{ref}`, the gold reward, the
                 preference pairs and the Bradley–Terry proxy fitted to them; the task's exact frontier
``trainer``      :func:`train_policy`: REINFORCE with per-token KL shaping, β fixed or set by a controller
``policy``       :class:`~kltutorial.toyrlhf.policy.TablePolicy`, and what every trainable policy provides
``recipes``      :func:`train_recipe`: PPO, RLOO, GRPO and Dr. GRPO with their KL placements, and
                 :func:`~.recipes.fixed_points.recipe_fixed_point`, the exact point each stops at (section 9)
``transformer``  a small causal transformer policy, fitted to the reference by enumeration
``cli``          the β sweep of ``python -m kltutorial.toyrlhf`` (``--help`` lists its options)
``bench``        steps per second of each recipe, ``python -m kltutorial.toyrlhf.bench``
===============  ===============================================================================

The exact optimum :math:`\pi^*_\beta(y) \propto \pi_\mathrm{ref}(y)\, e^{r(y)/\beta}`, best-of-n, KL and
per-position KL come from :mod:`kltutorial.exact`. Randomness is passed in: :func:`make_task` takes two
``numpy.random.Generator``\ s, :func:`train_policy` a ``torch.Generator``.

Examples
--------
>>> import numpy as np, torch
>>> from kltutorial import exact as ex
>>> from kltutorial import toyrlhf as toy
>>> task = toy.make_task(toy.TaskConfig(n_pairs=100), rng=np.random.default_rng(0),
...                      data_rng=np.random.default_rng([0, 100, 0]))
>>> run = toy.train_policy(task, toy.TrainConfig(beta=1.0, steps=20, batch_size=256),
...                        generator=torch.Generator().manual_seed(0))
>>> optimum = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, beta=1.0)
>>> ex.sequence_kl(run.logprobs, optimum) < ex.sequence_kl(task.ref_logprobs, optimum)
True
"""

from .cli import main
from .config import FIXED_BETAS, TaskConfig, TrainConfig
from .recipes import RECIPES, RecipeResult, recipe_fixed_point, train_recipe
from .task import (
    BANG,
    HAS_BANG,
    LENGTH,
    REWARDS,
    VOCAB,
    ToyFrontier,
    ToyTask,
    bang_count_distribution,
    exact_frontier,
    make_task,
    ranking_agreement,
)
from .trainer import TrainResult, train_policy

__all__ = [
    "FIXED_BETAS",
    "VOCAB",
    "BANG",
    "LENGTH",
    "HAS_BANG",
    "REWARDS",
    "TaskConfig",
    "TrainConfig",
    "ToyTask",
    "ToyFrontier",
    "TrainResult",
    "make_task",
    "train_policy",
    "RECIPES",
    "RecipeResult",
    "train_recipe",
    "recipe_fixed_point",
    "exact_frontier",
    "bang_count_distribution",
    "ranking_agreement",
    "main",
]
