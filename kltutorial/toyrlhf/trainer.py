r"""REINFORCE with a per-token KL penalty on the toy task (book section 11).

The policy is autoregressive: its next-token logits are the reference's plus a learned table
:math:`\theta`, one row per prefix (1 + 8 + 64 + 512 + 4096 = 4681 rows of 8), zero at the start, so
that :math:`\pi_\theta = \pi_\mathrm{ref}` at step 0 and every distribution over sequences, the optimum
:math:`\pi^*_\beta` included, is representable: a gap between the trained policy and :math:`\pi^*_\beta` is
the optimiser's, not the model's.

Training is sampled, as in real RLHF: per-token k1 (:func:`kltutorial.compute_token_kl`), per-token
reward shaping (:func:`kltutorial.shape_rewards`), rewards-to-go, a per-prefix Monte-Carlo critic as
baseline, Adam on :math:`\theta`, and :math:`\beta` fixed or set by a :mod:`kltutorial.controllers`
controller. What the run records is exact (:mod:`kltutorial.exact`).

Shapes: B batch, T = 5 positions, V = 8 tokens, P = 4681 prefixes, V**T = 32,768 sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .. import exact as ex
from .._validation import check_generator
from ..controllers import FixedKLController, KLController
from ..estimators import compute_token_kl
from ..exact.space import expected_value_unchecked, sequence_kl_unchecked, token_logprobs_unchecked
from ..objective import shape_rewards
from .config import TrainConfig
from .task import ToyTask, check_task

__all__ = ["TrainResult", "train_policy"]


@dataclass(frozen=True)
class TrainResult:
    """A trained policy and its per-step history (exact quantities by enumeration).

    Attributes
    ----------
    logprobs : Tensor, shape (V**T,)
        Log-prob of every sequence under the final policy.
    kl : ndarray, shape (steps,)
        Exact :math:`\\mathrm{KL}(\\pi_\\theta \\| \\pi_\\mathrm{ref})` (nats) of the policy that
        sampled step t.
    kl_sampled : ndarray, shape (steps,)
        The batch mean of the per-sequence k1 sum at step t: what the controller saw.
    beta : ndarray, shape (steps + 1,)
        β in force at step t; the last entry is the β after the final update.
    proxy, gold : ndarray, shape (steps,)
        Exact expected rewards of the policy that sampled step t.
    """

    logprobs: torch.Tensor
    kl: np.ndarray
    kl_sampled: np.ndarray
    beta: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray

    @property
    def penalized_proxy(self) -> np.ndarray:
        """``proxy − β₀ · kl`` at the run's initial β₀ = ``beta[0]``, shape (steps,).

        Priced at the initial β, not at the β in force, so that runs started from the same β₀ pay the
        same for every nat of KL (as :attr:`kltutorial.studies.dynamics.ControlledTraining.penalized_reward`).
        """
        return self.proxy - self.beta[0] * self.kl


def _check_train_args(
    task: object, config: object, generator: object, controller: object
) -> KLController:
    """Check the arguments of :func:`train_policy`; return the controller (fixed at ``config.beta``)."""
    check_task(task)
    if not isinstance(config, TrainConfig):
        raise TypeError(
            f"config must be a TrainConfig (e.g. TrainConfig(beta=0.5)), got {type(config).__name__}"
        )
    check_generator(generator)
    if (config.beta is None) == (controller is None):
        raise ValueError(
            "give beta one source: either TrainConfig(beta=...) for a fixed coefficient or a controller, "
            f"not {'both' if controller is not None else 'neither'}"
        )
    if controller is None:
        return FixedKLController(config.beta)
    if not isinstance(controller, KLController):
        raise TypeError(
            f"controller must be a KLController (e.g. AdaptiveKLController), got {type(controller).__name__}"
        )
    return controller


def _exact_summary(task: ToyTask, policy: torch.Tensor) -> tuple[float, float, float]:
    """Exact KL(pi_theta || pi_ref), E[proxy] and E[gold] of the policy with next-token table ``policy``.

    The same sums as :func:`~kltutorial.exact.sequence_kl` and :func:`~kltutorial.exact.
    expected_reward`, through their unchecked helpers: the trainer's own tensors need no check, and
    checking 32,768 log-probs five times a step would slow the loop by a fifth.
    """
    logprobs = token_logprobs_unchecked(task.space, policy).sum(-1)  # (V**T,), log pi_theta(y)
    return (
        sequence_kl_unchecked(logprobs, task.ref_logprobs),
        expected_value_unchecked(logprobs, task.proxy_reward),
        expected_value_unchecked(logprobs, task.gold_reward),
    )


def update_running_values(
    value: torch.Tensor, visits: torch.Tensor, rows: torch.Tensor, returns: torch.Tensor,
    min_step: float,
) -> None:
    """Move the value table towards the batch mean of the returns seen at each visited prefix.

    ``value[h] += a_h (mean of G over the visits of h in the batch - value[h])`` with
    ``a_h = max(n_h / (visits so far), min_step)``: a running mean at first, then an exponential
    average that can follow the policy as it moves. In place; rows not visited are left alone.
    """
    rows, returns = rows.reshape(-1), returns.reshape(-1)
    n_h = torch.zeros_like(value).index_add_(0, rows, torch.ones_like(returns))
    sum_h = torch.zeros_like(value).index_add_(0, rows, returns)
    visits += n_h
    step = torch.clamp(n_h / visits.clamp(min=1.0), min=min_step)
    hit = n_h > 0
    value[hit] += step[hit] * (sum_h[hit] / n_h[hit] - value[hit])


def train_policy(
    task: ToyTask,
    config: TrainConfig,
    *,
    generator: torch.Generator,
    controller: KLController | None = None,
    progress: bool = False,
) -> TrainResult:
    """Train the table policy with REINFORCE on the proxy reward minus a per-token KL penalty.

    Each step:

    1. sample B = ``config.batch_size`` sequences from :math:`\\pi_\\theta`, token by token
       (:func:`~kltutorial.exact.sample_autoregressive` with ``generator``);
    2. per-token k1, :math:`\\mathrm{kl}_t = \\log\\pi_\\theta(y_t|y_{<t})
       - \\log\\pi_\\mathrm{ref}(y_t|y_{<t})` (:func:`~kltutorial.compute_token_kl`), and shaped rewards
       :math:`r_t = -\\beta\\,\\mathrm{kl}_t` plus the proxy score at the last token
       (:func:`~kltutorial.shape_rewards`);
    3. rewards-to-go :math:`G_t = \\sum_{s \\ge t} r_s`, and the advantage :math:`A_t = G_t - b(y_{<t})`
       with the baseline :math:`b` a value table, one entry per prefix, fitted to past returns (a
       Monte-Carlo critic, as PPO's value head); for a prefix never seen before, the leave-one-out
       batch mean of :math:`G_t`;
    4. loss :math:`-\\frac{1}{B}\\sum_i \\sum_t A^i_t \\log\\pi_\\theta(y^i_t|y^i_{<t})`, one Adam step; then
       the critic moves towards this batch's returns;
    5. the controller sees the batch mean of :math:`\\sum_t \\mathrm{kl}_t` (``n_steps`` = B, as TRL counts).

    This is an unbiased gradient of :math:`J(\\theta) = \\mathbb{E}_{\\pi_\\theta}[r - \\beta \\log
    (\\pi_\\theta/\\pi_\\mathrm{ref})]`: differentiating the log-ratio adds
    :math:`-\\beta\\,\\mathbb{E}[\\nabla \\log \\pi_\\theta] = 0`; a token's score is uncorrelated with the
    KL of earlier tokens given its prefix, so rewards-to-go may drop them; and the baseline depends
    only on the prefix and on earlier batches. The learning rate decays linearly to 0 over the second
    half of training, which removes most of the noise floor.

    Every probability the history records is exact (a sum over all V**T sequences); only the gradient is
    sampled. The tensors are small: a process that runs only this loop is faster with one torch thread
    (``torch.set_num_threads(1)``, which the command line and the book's notebook set for themselves).

    Parameters
    ----------
    task : ToyTask
    config : TrainConfig
        Steps, batch size, learning rate, and ``beta`` for a fixed coefficient.
    generator : torch.Generator
        Draws every training batch, e.g. ``torch.Generator().manual_seed(0)``.
    controller : KLController, optional
        Sets β at every step instead of ``config.beta`` (exactly one of the two); its ``update`` is called
        once per step and its state changes.
    progress : bool
        Show a tqdm bar (keep False in notebooks).

    Returns
    -------
    TrainResult
    """
    controller = _check_train_args(task, config, generator, controller)
    space, B, steps = task.space, config.batch_size, config.steps
    theta = torch.zeros(space.n_prefixes, space.vocab_size, dtype=torch.float64, requires_grad=True)  # (P, V)
    opt = torch.optim.Adam([theta], lr=config.lr)
    decay_start = steps // 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < decay_start else max(0.0, (steps - s) / (steps - decay_start))
    )
    value = torch.zeros(space.n_prefixes, dtype=torch.float64)  # critic: expected reward-to-go per prefix
    visits = torch.zeros(space.n_prefixes, dtype=torch.float64)
    mask = torch.ones(B, space.length, dtype=torch.bool)  # every sequence has all T tokens
    hist: dict[str, list[float]] = {"kl": [], "kl_sampled": [], "proxy": [], "gold": []}
    betas = [controller.value]

    for _ in tqdm(range(steps), disable=not progress, desc="training", leave=False):
        beta = controller.value
        policy = torch.log_softmax(task.ref_table + theta, dim=-1)  # (P, V): next-token log-probs of pi_theta
        with torch.no_grad():
            kl, proxy, gold = _exact_summary(task, policy)  # exact, a sum over every sequence
            idx = ex.sample_autoregressive(space, policy.detach(), B, generator)  # 1. (B,)
        rows = space.prefix_ids[idx]  # (B, T)
        logp_tok = policy[rows, space.sequences[idx]]  # (B, T)
        with torch.no_grad():
            per_tok, per_seq = compute_token_kl(  # 2. (B, T), (B,)
                logp_tok.detach(), task.ref_token_logprobs[idx], estimator="k1", reduction="sum"
            )
            rewards = shape_rewards(task.proxy_reward[idx], per_tok, mask, beta=beta)  # (B, T)
            togo = rewards.flip(-1).cumsum(-1).flip(-1)  # 3. G_t, (B, T)
            loo = (togo.sum(0, keepdim=True) - togo) / (B - 1)  # (B, T)
            adv = togo - torch.where(visits[rows] > 0, value[rows], loo)
        loss = -(adv * logp_tok).sum(-1).mean()  # 4.
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        update_running_values(value, visits, rows, togo, min_step=config.critic_min_step)
        controller.update(float(per_seq.mean()), n_steps=B)  # 5.
        hist["kl"].append(kl)
        hist["kl_sampled"].append(float(per_seq.mean()))
        hist["proxy"].append(proxy)
        hist["gold"].append(gold)
        betas.append(controller.value)

    final = torch.log_softmax(task.ref_table + theta.detach(), dim=-1)
    return TrainResult(
        logprobs=ex.sequence_logprobs(space, final),
        kl=np.array(hist["kl"]),
        kl_sampled=np.array(hist["kl_sampled"]),
        beta=np.array(betas),
        proxy=np.array(hist["proxy"]),
        gold=np.array(hist["gold"]),
    )
