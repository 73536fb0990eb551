"""The command line of book sections 9 and 11: ``python -m kltutorial.toyrlhf`` trains the toy policy for
several β with one recipe (``--recipe``, REINFORCE by default) and compares each run with the exact optimum
:math:`\\pi^*_\\beta` and with the recipe's own exact fixed point.

The only place in the experiment where seeds become generators: ``--seed`` seeds the task's two NumPy
generators (the preference data keyed by ``[seed, n_pairs, 0]``, as on the book's page) and one torch
generator per training run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from .. import sequences as seq
from .config import FIXED_BETAS, TaskConfig, TrainConfig
from .recipes import RECIPES, get_recipe, recipe_fixed_point, train_recipe
from .task import make_task

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Run the β sweep; print and return KL, rewards and the distance to the exact optimum for each β."""
    parser = argparse.ArgumentParser(
        prog="python -m kltutorial.toyrlhf",
        description="Train the toy RLHF policy with one recipe for several β and compare each run with the "
        "exact optimum pi*_beta(y) ∝ pi_ref(y) exp(r(y)/beta) and with the recipe's own exact fixed point "
        "(book sections 9 and 11).",
    )
    parser.add_argument("--recipe", choices=RECIPES, default=RECIPES[0], metavar="NAME",
                        help="the recipe to train (default %(default)s): "
                        + "; ".join(f"{name}: {get_recipe(name).summary}" for name in RECIPES))
    parser.add_argument("--seed", type=int, default=0, help="task and training seed, >= 0 (default 0)")
    parser.add_argument("--n-pairs", type=int, default=TaskConfig.n_pairs,
                        help=f"preference pairs the proxy is fitted to (default {TaskConfig.n_pairs})")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps,
                        help=f"training steps per β (default {TrainConfig.steps})")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size,
                        help=f"sequences per step (default {TrainConfig.batch_size})")
    parser.add_argument("--lr", type=float, default=TrainConfig.lr,
                        help=f"Adam learning rate (default {TrainConfig.lr})")
    parser.add_argument("--betas", type=float, nargs="+", default=list(FIXED_BETAS),
                        help="KL coefficients to train (default: the book's sweep, "
                             + " ".join(f"{b:g}" for b in FIXED_BETAS) + ")")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0 (it seeds NumPy and torch generators), got {args.seed}")
    try:  # the configs' own messages (TrainConfig.steps must be ..., ...) as usage errors
        task_config = TaskConfig(n_pairs=args.n_pairs)
        runs = [TrainConfig(beta=b, steps=args.steps, batch_size=args.batch_size, lr=args.lr)
                for b in args.betas]
    except (TypeError, ValueError) as err:
        parser.error(str(err))

    task = make_task(task_config, rng=np.random.default_rng(args.seed),
                     data_rng=np.random.default_rng([args.seed, args.n_pairs, 0]))
    rows = []
    for config in tqdm(runs, desc=f"{args.recipe}, β sweep"):
        try:  # e.g. a batch size that is not a multiple of the recipe's group size
            run = train_recipe(task, args.recipe, config, generator=torch.Generator().manual_seed(args.seed),
                               progress=True)
        except ValueError as err:
            parser.error(str(err))
        optimum = seq.optimal_policy(task.ref_logprobs, task.proxy_reward, config.beta)
        if get_recipe(args.recipe).fixed_point is None:
            kl_to_fixed = float("nan")  # no fixed point: the recipe has no regulariser
        else:
            fixed = recipe_fixed_point(task, args.recipe, config.beta, group_size=run.group_size)
            kl_to_fixed = seq.sequence_kl(run.logprobs, fixed)
        rows.append({
            "recipe": args.recipe,
            "beta": config.beta,
            "kl": seq.sequence_kl(run.logprobs, task.ref_logprobs),
            "opt_kl": seq.sequence_kl(optimum, task.ref_logprobs),
            "proxy": seq.expected_reward(run.logprobs, task.proxy_reward),
            "gold": seq.expected_reward(run.logprobs, task.gold_reward),
            "kl_to_opt": seq.sequence_kl(run.logprobs, optimum),
            "kl_to_fixed": kl_to_fixed,
        })
    print(f"recipe {args.recipe}; KL* is pi*_beta's KL to pi_ref, fixed point: where the recipe's expected "
          "gradient vanishes (- where it has none)")
    print(f"{'beta':>6} {'KL':>8} {'KL*':>8} {'proxy':>8} {'gold':>8} {'KL(pi||pi*)':>12} "
          f"{'KL(pi||fixed)':>14}")
    for r in rows:
        fixed = "-" if r["kl_to_fixed"] != r["kl_to_fixed"] else f"{r['kl_to_fixed']:.4f}"
        print(f"{r['beta']:>6.3g} {r['kl']:>8.3f} {r['opt_kl']:>8.3f} {r['proxy']:>8.3f} "
              f"{r['gold']:>8.3f} {r['kl_to_opt']:>12.4f} {fixed:>14}")
    return rows
