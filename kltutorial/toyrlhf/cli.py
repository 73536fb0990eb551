"""The command line of book sections 9 and 11: ``python -m kltutorial.toyrlhf`` trains the toy policy for
several β with one recipe (``--recipe``, REINFORCE by default) and compares each run with the exact optimum
:math:`\\pi^*_\\beta` and with the recipe's own exact fixed point.

The only place in the experiment where seeds become generators: ``--seed`` seeds the task's two NumPy
generators (the preference data keyed by ``[seed, n_pairs, 0]``, as on the book's page) and one torch
generator per training run.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from .. import exact as ex
from .config import FIXED_BETAS, TaskConfig, TrainConfig
from .recipes import POLICIES, RECIPES, get_recipe, kl_to_fixed_points, recipe_fixed_point, train_recipe
from .task import make_task
from .transformer import TRANSFORMER_LR, TransformerPolicy, distill, fit_reference

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
    parser.add_argument("--policy", choices=POLICIES, default="table",
                        help="the table policy (default) or a small transformer fitted to the reference, "
                        "which is then the runs' reference; a transformer run also reports the floor of "
                        "distilling its fixed point into the same network")
    parser.add_argument("--distill-steps", type=int, default=200,
                        help="steps of distilling the fixed point into the network for a transformer run's "
                        "floor (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="task and training seed, >= 0 (default 0)")
    parser.add_argument("--n-pairs", type=int, default=TaskConfig.n_pairs,
                        help=f"preference pairs the proxy is fitted to (default {TaskConfig.n_pairs})")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps,
                        help=f"training steps per β (default {TrainConfig.steps})")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size,
                        help=f"sequences per step (default {TrainConfig.batch_size})")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"Adam learning rate (default {TrainConfig.lr} for the table, "
                        f"{TRANSFORMER_LR:g} for the transformer)")
    parser.add_argument("--betas", type=float, nargs="+", default=list(FIXED_BETAS),
                        help="KL coefficients to train (default: the book's sweep, "
                             + " ".join(f"{b:g}" for b in FIXED_BETAS) + ")")
    args = parser.parse_args(argv)
    if args.distill_steps < 1:
        parser.error(f"--distill-steps must be >= 1, got {args.distill_steps}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0 (it seeds NumPy and torch generators), got {args.seed}")
    try:  # the configs' own messages (TrainConfig.steps must be ..., ...) as usage errors
        task_config = TaskConfig(n_pairs=args.n_pairs)
        lr = args.lr if args.lr is not None else (TRANSFORMER_LR if args.policy == "transformer"
                                                  else TrainConfig.lr)
        runs = [TrainConfig(beta=b, steps=args.steps, batch_size=args.batch_size, lr=lr)
                for b in args.betas]
    except (TypeError, ValueError) as err:
        parser.error(str(err))

    task = make_task(task_config, rng=np.random.default_rng(args.seed),
                     data_rng=np.random.default_rng([args.seed, args.n_pairs, 0]))
    fitted = None
    if args.policy == "transformer":  # fitted once; every run starts from a copy and takes it as reference
        if get_recipe(args.recipe).algorithm == "reinforce":
            parser.error(f"{args.recipe} trains the table policy only; try --recipe ppo-k1-reward")
        fitted = TransformerPolicy(task.space, generator=torch.Generator().manual_seed(args.seed))
        fit_reference(fitted, task.ref_table)
    rows = []
    for config in tqdm(runs, desc=f"{args.recipe}, β sweep"):
        policy = copy.deepcopy(fitted) if fitted is not None else "table"
        try:  # e.g. a batch size that is not a multiple of the recipe's group size
            run = train_recipe(task, args.recipe, config, generator=torch.Generator().manual_seed(args.seed),
                               policy=policy, progress=True)
        except ValueError as err:
            parser.error(str(err))
        ref = run.task  # the chain, or the fitted network
        optimum = ex.optimal_policy(ref.ref_logprobs, ref.proxy_reward, config.beta)
        # no stable fixed point: NaN, printed as the recipe's stability
        kl_to_fixed, kl_to_opt = kl_to_fixed_points(ref, args.recipe, run.logprobs, config.beta,
                                                    group_size=run.group_size)
        floor = float("nan")
        if fitted is not None and get_recipe(args.recipe).fixed_point is not None:  # the network's best
            fixed = recipe_fixed_point(ref, args.recipe, config.beta, group_size=run.group_size)
            floor = distill(copy.deepcopy(fitted), fixed, steps=args.distill_steps)
        rows.append({
            "recipe": args.recipe,
            "beta": config.beta,
            "kl": ex.sequence_kl(run.logprobs, ref.ref_logprobs),
            "opt_kl": ex.sequence_kl(optimum, ref.ref_logprobs),
            "proxy": ex.expected_reward(run.logprobs, task.proxy_reward),
            "gold": ex.expected_reward(run.logprobs, task.gold_reward),
            "kl_to_opt": kl_to_opt,
            "kl_to_fixed": kl_to_fixed,
            "floor": floor,
        })
    print(f"recipe {args.recipe}, {args.policy} policy; KL* is pi*_beta's KL to pi_ref, fixed point: "
          "where the recipe's expected gradient vanishes (repels: it vanishes at a point that repels; "
          "none: nowhere)"
          + ("; floor: KL(pi||fixed) of the fixed point distilled into the same network" if fitted else ""))
    print(f"{'beta':>6} {'KL':>8} {'KL*':>8} {'proxy':>8} {'gold':>8} {'KL(pi||pi*)':>12} "
          f"{'KL(pi||fixed)':>14}" + (f" {'floor':>8}" if fitted else ""))

    stability = get_recipe(args.recipe).stability

    def cell(x: float, width: int) -> str:
        return f"{stability:>{width}}" if x != x else f"{x:>{width}.4f}"

    for r in rows:
        print(f"{r['beta']:>6.3g} {r['kl']:>8.3f} {r['opt_kl']:>8.3f} {r['proxy']:>8.3f} "
              f"{r['gold']:>8.3f} {r['kl_to_opt']:>12.4f} {cell(r['kl_to_fixed'], 14)}"
              + (f" {cell(r['floor'], 8)}" if fitted else ""))
    return rows
