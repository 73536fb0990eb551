r"""Where the KL penalty goes, in the reward or in the loss, and the gradient each one gives (section 9).

Two ways to penalise :math:`\mathrm{KL}(\pi_\theta\|\pi_{\mathrm{ref}})` while maximising a score
:math:`s(y)`, both built from the log-ratios :math:`\Delta_t = \log\pi_\theta(y_t\mid y_{<t}) -
\log\pi_{\mathrm{ref}}(y_t\mid y_{<t})` of sampled tokens:

* **in the reward** (PPO-style: lm-human-preferences, TRL's ``PPOTrainer``, OpenRLHF by default, verl with
  ``algorithm.use_kl_in_reward``): the per-token reward is :math:`r_t = -\beta\,k(\Delta_t)`, plus
  :math:`s(y)` at the last token; it is a *constant* to the optimiser, and reaches the parameters only through
  the advantages :math:`A_t` (GAE, :func:`gae_advantages`) of the policy-gradient term
  :math:`-A_t \nabla\log\pi_\theta(y_t\mid y_{<t})` (:func:`ppo_style_loss`);
* **in the loss** (GRPO-style, Shao et al. 2024: TRL's ``GRPOTrainer``, OpenRLHF ``--use_kl_loss``, verl
  ``actor.use_kl_loss``): the reward is the score alone, and :math:`\beta\,k(\Delta_t)` is added to the
  per-token loss and differentiated by autograd through :math:`\log\pi_\theta` (:func:`grpo_style_loss`).

On a sequence space small enough to list (:class:`~kltutorial.exact.SequenceSpace`) both losses are
computed as **exact expectations** over :math:`y\sim\pi_\theta`, the weights :math:`\pi_\theta(y)` held
fixed as a sampler's are, so that autograd of either gives its expected gradient with no sampling noise.
:func:`penalty_gradients` gives what to set them against: the gradients of the sequence-level KLs and of
the per-token KLs with the prefixes held fixed,

.. math::  \nabla^{\mathrm{tok}}\mathrm{KL}(\pi\|\pi_{\mathrm{ref}}) = \sum_t \mathbb{E}_{y_{<t}\sim\pi}
           \big[\nabla_\theta\,\mathrm{KL}\big(\pi_\theta(\cdot\mid y_{<t})\,\|\,
           \pi_{\mathrm{ref}}(\cdot\mid y_{<t})\big)\big],

which is what a per-token k2 loss follows, while k3 in the loss follows the same with the forward KL.

References: J. Schulman, P. Moritz, S. Levine, M. Jordan and P. Abbeel, "High-Dimensional Continuous
Control Using Generalized Advantage Estimation" (ICLR 2016); Z. Shao et al., "DeepSeekMath" (2024);
Y. Tang and R. Munos, "On a few pitfalls in KL divergence gradient estimation for RL" (2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .._validation import (
    as_real,
    check_choice,
    check_coef,
    check_float_tensor,
    check_mask,
    check_same_shape,
    check_table,
    check_values,
)
from ..estimators import Estimator, kl_estimate
from .gradients import GradientAgreement, check_sampled_estimator
from .space import SequenceSpace, check_space

__all__ = [
    "gae_advantages",
    "PenaltyGradients",
    "penalty_gradients",
    "score_gradient",
    "ppo_style_loss",
    "grpo_style_loss",
    "compare_gradients",
]

Critic = Literal["exact", "none"]


def _check_unit(x: object, name: str) -> float:
    v = as_real(x, name)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {v}")
    return v


# ----------------------------------------------------------------------------------------------------
# Generalised advantage estimation


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    attention_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Generalised advantage estimates and returns (Schulman et al. 2016), right-padded sequences.

    .. math::  \delta_t = r_t + \gamma V_{t+1} - V_t, \qquad
               A_t = \delta_t + \gamma\lambda A_{t+1}, \qquad R_t = A_t + V_t,

    with :math:`V_{t+1} = 0` and :math:`A_{t+1} = 0` after the last valid token (the episode ends
    there). :math:`\lambda = 1` gives :math:`A_t = \sum_{s\ge t}\gamma^{s-t} r_s - V_t`, the return minus
    the baseline; :math:`\lambda = 0` gives :math:`A_t = \delta_t`. TRL, OpenRLHF and verl compute the
    same recursion (RLHF runs use :math:`\gamma = 1`; the default :math:`\lambda` is 0.95 in TRL's PPO
    trainers up to v1.9, and 1 in OpenRLHF since v0.6.4 and in verl).

    Parameters
    ----------
    rewards : Tensor, shape (B, T)
        Per-token rewards :math:`r_t` (e.g. from :func:`~kltutorial.objective.shape_rewards`).
    values : Tensor, shape (B, T)
        The critic's :math:`V_t = V(y_{<t})`, the value of the state before token :math:`t`.
    attention_mask : Tensor, shape (B, T)
        1 for response tokens, 0 for padding, which must come after the response (right padding).
    gamma, lam : float
        Discount :math:`\gamma` and GAE's :math:`\lambda`, each in [0, 1].

    Returns
    -------
    advantages : Tensor, shape (B, T)
        :math:`A_t`, exactly 0 at padding.
    returns : Tensor, shape (B, T)
        :math:`R_t = A_t + V_t`, the critic's regression target, exactly 0 at padding.

    Examples
    --------
    >>> adv, ret = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]),
    ...                           torch.ones(1, 3), gamma=1.0, lam=0.5)
    >>> adv  # 0.3; 0.1 + 0.5 * 0.3; 0.1 + 0.5 * 0.25
    tensor([[0.2250, 0.2500, 0.3000]])
    >>> ret
    tensor([[0.7250, 0.8500, 1.0000]])
    """
    rewards = check_float_tensor(rewards, "rewards", ndim=2)
    values = check_float_tensor(values, "values", ndim=2)
    check_same_shape(rewards, "rewards", values, "values")
    mask = check_mask(attention_mask, "attention_mask", rewards.shape)
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise ValueError(
            "attention_mask must be right-padded (1s, then 0s, in each row): GAE runs backwards from the "
            "last valid token; move left padding to the right first"
        )
    gamma, lam = _check_unit(gamma, "gamma"), _check_unit(lam, "lam")
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    zero = torch.zeros((), dtype=dtype)
    r = torch.where(mask, rewards.to(dtype), zero)  # padding: no reward ...
    v = torch.where(mask, values.to(dtype), zero)  # ... and no value after the end
    advantages = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])  # A_{t+1}, shape (B,)
    for t in reversed(range(r.shape[1])):
        next_value = v[:, t + 1] if t + 1 < r.shape[1] else torch.zeros_like(running)
        delta = r[:, t] + gamma * next_value - v[:, t]  # δ_t = r_t + γ V_{t+1} - V_t
        running = delta + gamma * lam * running  # A_t = δ_t + γλ A_{t+1}
        advantages[:, t] = running
    advantages = torch.where(mask, advantages, zero)
    return advantages, advantages + v


# ----------------------------------------------------------------------------------------------------
# Exact quantities on a listable sequence space


def _check_problem(
    space: object, logits: object, ref_table: object | None, scores: object | None = None
) -> tuple[SequenceSpace, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    space = check_space(space)
    logits = check_float_tensor(logits, "logits", ndim=2)
    want = (space.n_prefixes, space.vocab_size)
    if tuple(logits.shape) != want:
        raise ValueError(f"logits must have shape {want}, one row per prefix, got {tuple(logits.shape)}")
    if ref_table is not None:
        ref_table = check_table(space, check_float_tensor(ref_table, "ref_table", ndim=2), "ref_table")
    if scores is not None:
        scores = check_values(scores, "scores", space.n_sequences)
    return space, logits, ref_table, scores


def token_logprobs_unchecked(space: SequenceSpace, logits: torch.Tensor) -> torch.Tensor:
    """log π_θ(y_t | y_<t) of every listed sequence, shape (V**T, T), differentiable in the logits."""
    return torch.log_softmax(logits, dim=-1)[space.prefix_ids, space.sequences]


def _exact_values(space: SequenceSpace, weights: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """The exact critic V(y_<t) = E[R_t | y_<t] for every sequence and position, shape (V**T, T).

    ``weights`` are π(y), (V**T,); ``returns`` the returns-to-go R_t(y), (V**T, T).
    """
    rows = space.prefix_ids  # (V**T, T)
    mass = torch.zeros(space.n_prefixes, dtype=weights.dtype).index_add_(
        0, rows.reshape(-1), weights[:, None].expand_as(rows).reshape(-1)
    )  # π(h) per prefix row, (P,)
    total = torch.zeros_like(mass).index_add_(0, rows.reshape(-1), (weights[:, None] * returns).reshape(-1))
    return (total / mass)[rows]  # (V**T, T)


@dataclass(frozen=True)
class PenaltyGradients:
    """The four KL gradients a penalty's gradient can be set against; each of shape (P, V), like the logits.

    Attributes
    ----------
    reverse_sequence : Tensor
        :math:`\\nabla_\\theta\\,\\mathrm{KL}(\\pi_\\theta\\|\\pi_{\\mathrm{ref}})` over whole sequences,
        the penalty of the objective.
    forward_sequence : Tensor
        :math:`\\nabla_\\theta\\,\\mathrm{KL}(\\pi_{\\mathrm{ref}}\\|\\pi_\\theta)` over whole sequences.
    reverse_per_token : Tensor
        :math:`\\sum_t \\mathbb{E}_{y_{<t}\\sim\\pi}[\\nabla_\\theta \\mathrm{KL}(\\pi_\\theta(\\cdot\\mid
        y_{<t})\\|\\pi_{\\mathrm{ref}}(\\cdot\\mid y_{<t}))]`, the prefixes' probabilities held fixed.
    forward_per_token : Tensor
        The same with :math:`\\mathrm{KL}(\\pi_{\\mathrm{ref}}(\\cdot\\mid y_{<t})\\|\\pi_\\theta(\\cdot\\mid
        y_{<t}))`.
    """

    reverse_sequence: torch.Tensor
    forward_sequence: torch.Tensor
    reverse_per_token: torch.Tensor
    forward_per_token: torch.Tensor


def penalty_gradients(
    space: SequenceSpace, logits: torch.Tensor, ref_table: torch.Tensor
) -> PenaltyGradients:
    r"""The gradients of the sequence-level and per-token KLs of an autoregressive policy
    :math:`\pi_\theta(\cdot\mid h) = \mathrm{softmax}(\theta_h)`, exactly.

    Parameters
    ----------
    space : SequenceSpace
    logits : Tensor, shape (P, V)
        The policy's logits :math:`\theta`, one row per prefix (float64 for exact comparisons).
    ref_table : Tensor, shape (P, V)
        The reference's next-token log-probs.

    Returns
    -------
    PenaltyGradients

    Examples
    --------
    With one token the per-token and sequence-level KLs are the same:

    >>> space = SequenceSpace(vocab_size=3, length=1)
    >>> ref = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64).log()
    >>> g = penalty_gradients(space, torch.tensor([[0.3, -0.2, 0.1]], dtype=torch.float64), ref)
    >>> torch.allclose(g.reverse_sequence, g.reverse_per_token)
    True
    """
    space, logits, ref_table, _ = _check_problem(space, logits, ref_table)
    theta = logits.detach().clone().requires_grad_(True)
    table = torch.log_softmax(theta, dim=-1)  # (P, V)
    per_tok = table[space.prefix_ids, space.sequences]  # (V**T, T)
    ref_tok = ref_table[space.prefix_ids, space.sequences]
    logp, logq = per_tok.sum(-1), ref_tok.sum(-1)  # (V**T,)
    p = logp.exp()
    # next-token KLs of every prefix row, (P,), then summed along each sequence's prefixes
    reverse_rows = (table.exp() * (table - ref_table)).sum(-1)
    forward_rows = (ref_table.exp() * (ref_table - table)).sum(-1)
    weights = p.detach()  # the prefixes' probabilities, held fixed
    targets = [
        (p * (logp - logq)).sum(),  # KL(π || π_ref)
        (logq.exp() * (logq - logp)).sum(),  # KL(π_ref || π)
        (weights * reverse_rows[space.prefix_ids].sum(-1)).sum(),
        (weights * forward_rows[space.prefix_ids].sum(-1)).sum(),
    ]
    grads = [torch.autograd.grad(t, theta, retain_graph=True)[0] for t in targets]
    return PenaltyGradients(*grads)


def score_gradient(space: SequenceSpace, logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    r""":math:`\nabla_\theta\,\mathbb{E}_{y\sim\pi_\theta}[s(y)] = \sum_y s(y)\,\nabla_\theta\pi_\theta(y)`,
    exactly; shape (P, V).

    Parameters
    ----------
    space : SequenceSpace
    logits : Tensor, shape (P, V)
    scores : Tensor, shape (V**T,)
        One score per listed sequence.

    Returns
    -------
    Tensor, shape (P, V)

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=1)
    >>> score_gradient(space, torch.zeros(1, 2, dtype=torch.float64),
    ...                torch.tensor([1.0, 0.0], dtype=torch.float64))  # p(1 - p) and -p(1 - p)
    tensor([[ 0.2500, -0.2500]], dtype=torch.float64)
    """
    space, logits, _, scores = _check_problem(space, logits, None, scores)
    theta = logits.detach().clone().requires_grad_(True)
    p = token_logprobs_unchecked(space, theta).sum(-1).exp()  # (V**T,)
    return torch.autograd.grad((p * scores).sum(), theta)[0]


# ----------------------------------------------------------------------------------------------------
# The two placements, as exact expected losses


def ppo_style_loss(
    space: SequenceSpace,
    logits: torch.Tensor,
    ref_table: torch.Tensor,
    scores: torch.Tensor,
    beta: float,
    *,
    estimator: Estimator = "k1",
    lam: float = 1.0,
    critic: Critic = "exact",
) -> torch.Tensor:
    r"""The expected policy-gradient loss with the KL **in the reward**, at the on-policy point.

    1. per-token rewards :math:`r_t = -\beta\,k(\Delta_t) + s(y)\,[t = T]`, held constant;
    2. the critic: the exact :math:`V(y_{<t}) = \mathbb{E}_\pi[\sum_{s\ge t} r_s \mid y_{<t}]`
       (``critic="exact"``), or none (:math:`V = 0`);
    3. advantages :math:`A_t` by :func:`gae_advantages` with :math:`\gamma = 1`;
    4. the loss :math:`-\sum_y \pi_\theta(y)\sum_t A_t(y) \log\pi_\theta(y_t\mid y_{<t})`, the weights
       and advantages held fixed.

    At the on-policy point PPO's ratio is 1 and its clipping inactive, so this is PPO's loss there; its
    gradient is :math:`\mathbb{E}_\pi[-\sum_t A_t\nabla\log\pi_\theta(y_t\mid y_{<t})]`. With k1 and
    an exact critic (any :math:`\lambda`), or with :math:`\lambda = 1`, that is
    :math:`-\nabla(\mathbb{E}[s] - \beta\,\mathrm{KL}(\pi_\theta\|\pi_{\mathrm{ref}}))`.

    Parameters
    ----------
    space : SequenceSpace
    logits : Tensor, shape (P, V)
        The policy's logits :math:`\theta` (set ``requires_grad`` to differentiate the loss).
    ref_table : Tensor, shape (P, V)
        The reference's next-token log-probs.
    scores : Tensor, shape (V**T,)
        The score :math:`s(y)` of every listed sequence.
    beta : float
        :math:`\beta \ge 0`.
    estimator : str
        The per-token KL estimate put in the reward: a sampled estimator's name or alias (default k1).
    lam : float
        GAE's :math:`\lambda` in [0, 1].
    critic : {"exact", "none"}

    Returns
    -------
    Tensor, shape ()
        The loss, differentiable in ``logits``.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> theta = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    >>> ref = torch.tensor([0.7, 0.3], dtype=torch.float64).log().expand(3, 2)
    >>> s = torch.zeros(4, dtype=torch.float64)
    >>> (g,) = torch.autograd.grad(ppo_style_loss(space, theta, ref, s, beta=1.0), theta)
    >>> torch.allclose(g, penalty_gradients(space, theta, ref).reverse_sequence)
    True
    """
    space, logits, ref_table, scores = _check_problem(space, logits, ref_table, scores)
    beta = check_coef(beta, "beta")
    name = check_sampled_estimator(estimator)
    lam = _check_unit(lam, "lam")
    check_choice(critic, "critic", ("exact", "none"))
    per_tok = token_logprobs_unchecked(space, logits)  # (V**T, T)
    ref_tok = ref_table[space.prefix_ids, space.sequences]
    weights = per_tok.sum(-1).exp().detach()  # π(y), the sampler's: fixed
    with torch.no_grad():
        # 1. rewards: the penalty at every token, the score at the last
        rewards = -beta * kl_estimate(per_tok, ref_tok, name)  # (V**T, T)
        rewards[:, -1] += scores
        # 2. the critic
        if critic == "exact":
            to_go = rewards.flip(-1).cumsum(-1).flip(-1)  # R_t = sum_{s >= t} r_s
            values = _exact_values(space, weights, to_go)
        else:
            values = torch.zeros_like(rewards)
        # 3. GAE, gamma = 1
        advantages, _ = gae_advantages(rewards, values, torch.ones_like(rewards, dtype=torch.bool), 1.0, lam)
    # 4. the policy-gradient loss
    return -(weights * (advantages * per_tok).sum(-1)).sum()


def grpo_style_loss(
    space: SequenceSpace,
    logits: torch.Tensor,
    ref_table: torch.Tensor,
    scores: torch.Tensor,
    beta: float,
    *,
    estimator: Estimator = "k3",
) -> torch.Tensor:
    r"""The expected loss with the KL **in the loss**, GRPO-style, at the on-policy point.

    .. math::  L(\theta) = \sum_y \pi(y)\Big[-\big(s(y) - \mathbb{E}_\pi[s]\big)\log\pi_\theta(y)
               + \beta \sum_t k(\Delta_t(y))\Big], \qquad \pi(y) \text{ and the advantage held fixed.}

    The advantage is the score minus its exact mean, the limit of GRPO's group baseline for a large group
    (without GRPO's division by the group's standard deviation, which rescales it); the KL term is the
    per-token estimate, k3 as in Shao et al. (2024), summed over the tokens (GRPO averages over a
    sequence's tokens; on a space of fixed length that divides both terms by :math:`T`). The gradient is
    :math:`-\nabla\mathbb{E}[s] + \beta\,\mathbb{E}_\pi[\sum_t \nabla k(\Delta_t)]`, and the second term
    is the per-token gradient of the forward KL for k3, of the reverse KL for k2, k1+ and k3+, and 0 for k1.

    Parameters
    ----------
    space, logits, ref_table, scores, beta
        As in :func:`ppo_style_loss`.
    estimator : str
        The sampled estimator in the loss (default k3, GRPO's).

    Returns
    -------
    Tensor, shape ()
        The loss, differentiable in ``logits``.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> theta = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    >>> ref = torch.tensor([0.7, 0.3], dtype=torch.float64).log().expand(3, 2)
    >>> s = torch.zeros(4, dtype=torch.float64)
    >>> (g,) = torch.autograd.grad(grpo_style_loss(space, theta, ref, s, beta=1.0), theta)
    >>> torch.allclose(g, penalty_gradients(space, theta, ref).forward_per_token)
    True
    """
    space, logits, ref_table, scores = _check_problem(space, logits, ref_table, scores)
    beta = check_coef(beta, "beta")
    name = check_sampled_estimator(estimator)
    per_tok = token_logprobs_unchecked(space, logits)  # (V**T, T)
    ref_tok = ref_table[space.prefix_ids, space.sequences]
    logp = per_tok.sum(-1)  # (V**T,)
    weights = logp.exp().detach()
    advantage = scores - (weights * scores).sum()  # s(y) - E[s]
    penalty = kl_estimate(per_tok, ref_tok, name).sum(-1)  # sum_t k(Δ_t), differentiable
    return (weights * (-advantage * logp + beta * penalty)).sum()


def compare_gradients(g: torch.Tensor, h: torch.Tensor) -> GradientAgreement:
    """How close the gradient ``g`` is to the target ``h``: ``max |g - h|``, cosine, norm ratio.

    Examples
    --------
    >>> compare_gradients(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0])).norm_ratio
    0.5
    """
    g = check_float_tensor(g, "g")
    h = check_float_tensor(h, "h")
    check_same_shape(g, "g", h, "h")
    return GradientAgreement.between(g, h)
