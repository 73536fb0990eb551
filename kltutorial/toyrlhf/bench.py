"""How fast each recipe trains on the toy task, on the table policy and on the transformer (book section 9).

``python -m kltutorial.toyrlhf.bench`` times a few steps of every recipe (:data:`~kltutorial.toyrlhf.RECIPES`)
and prints steps per second, with the ratio to ``reinforce-k1-reward`` on the table policy measured in the
same run. The transformer is fitted to the reference once (not timed) and copied for each recipe. The time
of a step includes sampling the batch and the recipe's whole update (PPO: its epochs and its critic); the
exact record of the run is taken twice per timing, at the start and at the end.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence

import numpy as np
import torch

from .config import TaskConfig, TrainConfig
from .recipes import RECIPES, get_recipe, train_recipe
from .task import ToyTask, make_task
from .transformer import TRANSFORMER_LR, TransformerPolicy, fit_reference

__all__ = ["recipe_speeds", "format_speeds", "main"]


def recipe_speeds(
    task: ToyTask, recipes: Sequence[str], *, steps: int, batch_size: int, transformer: bool, seed: int = 0
) -> list[dict[str, object]]:
    """Time ``steps`` training steps of each recipe; one row per (recipe, policy) with ``steps_per_s``."""
    rows: list[dict[str, object]] = []
    fitted = None
    if transformer:
        fitted = TransformerPolicy(task.space, generator=torch.Generator().manual_seed(seed))
        fit_reference(fitted, task.ref_table)
    for name in recipes:
        for policy in ("table", "transformer") if transformer else ("table",):
            if policy == "transformer" and get_recipe(name).algorithm == "reinforce":
                continue  # a table trainer
            config = TrainConfig(beta=0.3, steps=steps, batch_size=batch_size,
                                 lr=TRANSFORMER_LR if policy == "transformer" else TrainConfig.lr)
            module = copy.deepcopy(fitted) if policy == "transformer" else "table"
            start = time.perf_counter()
            train_recipe(task, name, config, generator=torch.Generator().manual_seed(seed), policy=module,
                         record_every=steps)
            seconds = time.perf_counter() - start
            rows.append({"recipe": name, "policy": policy, "steps_per_s": steps / seconds})
    return rows


def format_speeds(rows: Sequence[dict[str, object]]) -> str:
    """The rows as a table, with each recipe's speed relative to the first row's (the baseline)."""
    base = float(rows[0]["steps_per_s"])
    lines = [f"{'recipe':22s} {'policy':12s} {'steps/s':>9} {'vs ' + str(rows[0]['recipe']):>26}"]
    for r in rows:
        speed = float(r["steps_per_s"])
        lines.append(f"{r['recipe']!s:22s} {r['policy']!s:12s} {speed:9.2f} {speed / base:25.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, object]]:
    """Time every recipe and print the table."""
    parser = argparse.ArgumentParser(prog="python -m kltutorial.toyrlhf.bench",
                                     description="Training steps per second of each recipe on the toy task.")
    parser.add_argument("--steps", type=int, default=20, help="steps timed per recipe (default 20)")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size,
                        help=f"sequences per step (default {TrainConfig.batch_size})")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES, metavar="NAME",
                        help="recipes to time (default: all)")
    parser.add_argument("--no-transformer", action="store_true", help="time the table policy only")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 16 or args.batch_size % 16:
        parser.error("--steps must be >= 1 and --batch-size a positive multiple of 16 (GRPO's group)")
    if args.recipes[0] != RECIPES[0]:
        args.recipes = [RECIPES[0], *[r for r in args.recipes if r != RECIPES[0]]]  # the baseline first
    torch.set_num_threads(1)
    task = make_task(TaskConfig(), rng=np.random.default_rng(0),
                     data_rng=np.random.default_rng([0, TaskConfig().n_pairs, 0]))
    rows = recipe_speeds(task, args.recipes, steps=args.steps, batch_size=args.batch_size,
                         transformer=not args.no_transformer)
    print(format_speeds(rows))
    return rows


if __name__ == "__main__":
    main()
