"""The command line of book section 11: ``python -m kltutorial.toyrlhf`` trains the toy policy for several
β and compares each with the exact optimum :math:`\\pi^*_\\beta`.

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
from .task import make_task
from .trainer import train_policy

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Run the β sweep; print and return KL, rewards and the distance to the exact optimum for each β."""
    parser = argparse.ArgumentParser(
        prog="python -m kltutorial.toyrlhf",
        description="Train the toy RLHF policy for several β and compare each with the exact "
        "optimum pi*_beta(y) ∝ pi_ref(y) exp(r(y)/beta) (book section 11).",
    )
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
    for config in tqdm(runs, desc="β sweep"):
        run = train_policy(task, config, generator=torch.Generator().manual_seed(args.seed))
        optimum = seq.optimal_policy(task.ref_logprobs, task.proxy_reward, config.beta)
        rows.append({
            "beta": config.beta,
            "kl": seq.sequence_kl(run.logprobs, task.ref_logprobs),
            "opt_kl": seq.sequence_kl(optimum, task.ref_logprobs),
            "proxy": seq.expected_reward(run.logprobs, task.proxy_reward),
            "gold": seq.expected_reward(run.logprobs, task.gold_reward),
            "kl_to_opt": seq.sequence_kl(run.logprobs, optimum),
        })
    print(f"{'beta':>6} {'KL':>8} {'KL*':>8} {'proxy':>8} {'gold':>8} {'KL(pi||pi*)':>12}")
    for r in rows:
        print(f"{r['beta']:>6.3g} {r['kl']:>8.3f} {r['opt_kl']:>8.3f} {r['proxy']:>8.3f} "
              f"{r['gold']:>8.3f} {r['kl_to_opt']:>12.4f}")
    return rows
