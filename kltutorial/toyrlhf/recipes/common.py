r"""What every recipe's training loop shares: the sampled batch, the clipped policy-gradient term, the
optimiser and its schedule, the exact record of the run, and the result (book sections 9 and 11).

Each algorithm module (``ppo``, ``rloo``, ``grpo``) writes only its own update, one batch at a time; the
loop here samples the batch from the policy, calls the update, steps the learning-rate schedule and records
the exact KL and rewards every ``record_every`` steps.

Shapes: B batch, M minibatch, T = 5 positions, V = 8 tokens, P prefix rows, V**T sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from ... import exact as ex
from ..config import TrainConfig
from ..task import ToyTask

__all__ = ["Batch", "RecipeResult", "sample_batch", "clipped_pg_loss", "minibatches", "run_loop"]


@dataclass(frozen=True)
class Batch:
    """One batch of sampled sequences with everything an update needs, all without gradient.

    Attributes
    ----------
    sequences : Tensor, shape (B, T), int64
    old_logprobs : Tensor, shape (B, T)
        :math:`\\log\\pi_{\\theta_\\mathrm{old}}(y_t\\mid y_{<t})`, the sampling policy's.
    ref_logprobs : Tensor, shape (B, T)
        :math:`\\log\\pi_\\mathrm{ref}(y_t\\mid y_{<t})`.
    scores : Tensor, shape (B,)
        The proxy reward of each sequence.
    """

    sequences: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    scores: torch.Tensor

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def select(self, rows: torch.Tensor) -> Batch:
        """The sub-batch of the given rows (a minibatch)."""
        return Batch(
            self.sequences[rows], self.old_logprobs[rows], self.ref_logprobs[rows], self.scores[rows]
        )


@dataclass(frozen=True)
class RecipeResult:
    """A recipe's trained policy and its exact history.

    Attributes
    ----------
    recipe : str
    beta : float
    logprobs : Tensor, shape (V**T,), float64
        :math:`\\log\\pi_\\theta(y)` of every sequence under the final policy.
    task : ToyTask
        The task the run used; for a neural policy its reference is the network fitted to the chain
        (:func:`~kltutorial.toyrlhf.recipes.with_reference`), so fixed points are computed against it.
    group_size : int or None
        G of a group baseline (RLOO's k, GRPO's G); None for a critic.
    steps : ndarray, shape (R,)
        The steps at which the history was recorded (the last is ``config.steps``, the final policy).
    kl, proxy, gold : ndarray, shape (R,)
        Exact :math:`\\mathrm{KL}(\\pi_\\theta\\|\\pi_\\mathrm{ref})` and expected rewards at those steps.
    settings : object
        The recipe's settings the run used (e.g. :class:`~kltutorial.toyrlhf.recipes.PPOSettings`).
    """

    recipe: str
    beta: float
    logprobs: torch.Tensor
    task: ToyTask
    group_size: int | None
    steps: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray
    settings: object


def sample_batch(
    task: ToyTask, policy: torch.nn.Module, batch_size: int, generator: torch.Generator
) -> Batch:
    """Sample ``batch_size`` sequences token by token from the policy and gather their log-probs."""
    with torch.no_grad():
        table = policy.table()  # (P, V)
        idx = ex.sample_autoregressive(task.space, table, batch_size, generator)  # (B,)
        rows, tokens = task.space.prefix_ids[idx], task.space.sequences[idx]  # (B, T) each
        return Batch(tokens, table[rows, tokens], task.ref_token_logprobs[idx], task.proxy_reward[idx])


def token_logprobs(policy: torch.nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """:math:`\\log\\pi_\\theta(y_t\\mid y_{<t})` of the given tokens, shape (N, T), differentiable."""
    return policy(sequences).gather(-1, sequences[..., None]).squeeze(-1)


def clipped_pg_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""PPO's clipped surrogate per token (Schulman et al. 2017, eq. 7), to be minimised; shape (N, T).

    .. math::  \ell_t = \max\big(-A_t\,\rho_t,\ -A_t\,\mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\big),
               \qquad \rho_t = \frac{\pi_\theta(y_t\mid y_{<t})}{\pi_{\theta_\mathrm{old}}(y_t\mid y_{<t})}

    Returns the per-token loss and the ratio :math:`\rho_t` (differentiable). At :math:`\rho = 1` its
    gradient is :math:`-A_t\nabla\log\pi_\theta`, the policy gradient.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    loss = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
    return loss, ratio


def minibatches(size: int, count: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices of ``count`` equal minibatches of a shuffled batch of ``size`` rows."""
    perm = torch.randperm(size, generator=generator)
    yield from perm.reshape(count, size // count)


def make_optimizer(
    params: Iterator[torch.nn.Parameter], config: TrainConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Adam at ``config.lr``, constant for the first half of the steps, then decaying linearly to 0.

    The decay removes most of the sampling noise at the end of a run (the same schedule as
    :func:`~kltutorial.toyrlhf.train_policy`).
    """
    opt = torch.optim.Adam(params, lr=config.lr)
    steps, start = config.steps, config.steps // 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < start else max(0.0, (steps - s) / (steps - start))
    )
    return opt, sched


Update = Callable[[Batch, float], None]


def run_loop(
    task: ToyTask,
    policy: torch.nn.Module,
    config: TrainConfig,
    update: Update,
    *,
    generator: torch.Generator,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    record_every: int,
    progress: bool,
    desc: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The training loop: every step sample a batch, call ``update(batch, beta)``, step the schedule.

    Records the exact KL, proxy and gold reward of the policy before steps 0, ``record_every``, ... and
    after the last step. Returns (steps, kl, proxy, gold).
    """
    hist: list[tuple[int, float, float, float]] = []

    def record(step: int) -> None:
        with torch.no_grad():
            logp = ex.sequence_logprobs(task.space, policy.table())
        kl = ex.sequence_kl(logp, task.ref_logprobs)
        hist.append((step, kl, ex.expected_reward(logp, task.proxy_reward),
                     ex.expected_reward(logp, task.gold_reward)))

    for step in tqdm(range(config.steps), disable=not progress, desc=desc, leave=False):
        if step % record_every == 0:
            record(step)
        update(sample_batch(task, policy, config.batch_size, generator), config.beta)
        scheduler.step()
    record(config.steps)
    steps, kl, proxy, gold = (np.array(col) for col in zip(*hist, strict=True))
    return steps, kl, proxy, gold
