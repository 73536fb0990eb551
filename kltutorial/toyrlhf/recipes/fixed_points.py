r"""Where each recipe's expected on-policy gradient vanishes, exactly, and that gradient itself (section 9).

* ``reinforce-k1-reward``, ``ppo-k1-reward``, ``rloo-k1-reward``: the loss's expected gradient is
  :math:`-\nabla(\mathbb{E}[s] - \beta\,\mathrm{KL})`, and the fixed point :math:`\pi^*_\beta`;
* ``ppo-k3-reward``: :math:`-\nabla\mathbb{E}[s] + \beta(\nabla\mathrm{KL} -
  \nabla^\mathrm{tok}\mathrm{KL}_\mathrm{fwd})`; no stable fixed point (see below);
* ``dr-grpo-k2-loss``, ``dr-grpo-k3plus-loss``: :math:`-\tfrac{G-1}{G}\nabla\mathbb{E}[s] +
  \beta\nabla^\mathrm{tok}\mathrm{KL}`; the per-token reverse KL's fixed point with :math:`c = \beta G/(G-1)`;
* ``dr-grpo-k3-loss``: :math:`-\tfrac{G-1}{G}\nabla\mathbb{E}[s] + \beta\nabla^\mathrm{tok}
  \mathrm{KL}_\mathrm{fwd}`; the per-token forward KL's fixed point with :math:`c = \beta G/(G-1)`;
* ``grpo-k3-loss``: the same with the score replaced by GRPO's expected advantage :math:`g_\pi(s)`
  (below); forward, :math:`c = \beta`;
* ``grpo-k3ratio-loss``: GRPO with k3 weighted by the differentiable importance ratio (TRL 1.16's
  default ``use_bias_correction_kl=True``): on policy the term's expected gradient is that of
  :math:`\mathbb{E}_\pi[k_3]`, the per-token reverse KL, so the reverse fixed point with GRPO's
  :math:`g_\pi(s)`, :math:`c = \beta`;
* ``dr-grpo-k1-loss``: :math:`-\tfrac{G-1}{G}\nabla\mathbb{E}[s]`; no fixed point, no regulariser.

:math:`\nabla^\mathrm{tok}` is the gradient of the per-token KLs with the prefixes' probabilities held
fixed (:func:`~kltutorial.exact.placement.penalty_gradients`). The coefficients:

* a leave-one-out baseline (RLOO) or a critic that is exact at the fixed point (PPO's, REINFORCE's) adds no
  bias, so the score keeps weight 1;
* a group mean that includes the sample, :math:`\mu_G = \frac1G\sum_j s_j`, gives
  :math:`\mathbb{E}[(s_i - \mu_G)\nabla\log\pi(y_i)] = \frac{G-1}{G}\nabla\mathbb{E}[s]`, since the
  other :math:`G - 1` samples are independent of :math:`y_i` and :math:`\mathbb{E}[\nabla\log\pi] = 0`;
  against a penalty of weight :math:`\beta` that is the per-token fixed point with :math:`c = \beta G/(G-1)`;
* GRPO also divides by the group's std, which depends on the other members. They are independent of the
  sequence, so the expected gradient is :math:`\mathbb{E}_\pi[g_\pi(s)\nabla\log\pi(y)]` with
  :math:`g_\pi(x)` the expected advantage of a score :math:`x` over the other :math:`G-1` draws
  (:func:`group_advantage_curve`): the fixed point is the forward one with the score replaced by
  :math:`g_\pi(s)` and :math:`c = \beta`, where :math:`g_\pi` depends on the fixed point itself. It is
  solved self-consistently, :math:`\pi \to g_\pi \to` the fixed point of :math:`g_\pi`, damped, from
  :math:`\pi_\mathrm{ref}`. For a large group :math:`g_\pi(x) \to (x - \mathbb{E}_\pi s)/\sigma_\pi`;
  at G = 16 on a concentrated policy, where many groups tie, it is far from that limit.

No stable fixed point for two recipes. ``dr-grpo-k1-loss``: k1's expected gradient in the loss is 0, so
nothing holds the policy and it climbs the score until it is
deterministic. ``ppo-k3-reward``: as a reward, k3's
per-token value :math:`\rho/\pi - 1 + \log(\pi/\rho)` grows like :math:`\rho/\pi` as a token's probability
:math:`\pi` falls below the reference's :math:`\rho`, so a token pushed down is penalised *more* when it is
sampled, and pushed down further: the penalty rewards dropping tokens (its gradient subtracts the forward
KL's), and the point where the expected gradient vanishes repels on both sides: with V = 2, T = 1,
:math:`\pi_\mathrm{ref} = (0.5, 0.5)`, scores (1, 0) and :math:`\beta = 0.3` it is
:math:`\pi = (0.079, 0.921)`, and a policy on either side of it moves away. Where such a run ends
depends on :math:`\beta` and on the schedule, not on a fixed point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ... import exact as ex
from ..._validation import check_positive, check_positive_int
from ...exact.fixed_points import per_token_fixed_point
from ...exact.placement import grpo_style_loss, ppo_style_loss
from ..task import ToyTask, check_task
from .registry import RecipeSpec, get_recipe

__all__ = ["GROUP_DRAWS", "ADVANTAGE_SCALES", "recipe_fixed_point", "fixed_point_table",
           "loss_fixed_point_table",
           "expected_gradient", "score_std", "group_advantage_curve", "FixedPointCurve", "fixed_point_curve"]

#: Groups in the Monte Carlo quadrature of GRPO's expected advantage (:func:`group_advantage_curve`).
GROUP_DRAWS: int = 4_000

# Iterations of the self-consistent GRPO fixed point: pi -> g_pi -> the forward fixed point with the score
# g_pi(s). Undamped it settles in about 15 iterations on the book's task (g_pi is piecewise constant in pi,
# common random numbers); after 50 the steps are halved, in case it cycles. It stops once g moves by less
# than 1e-10.
_STD_ITERATIONS = 200


def score_std(space: ex.SequenceSpace, table: torch.Tensor, scores: torch.Tensor) -> float:
    """The std of the score under the policy with next-token table ``table``, exactly."""
    p = ex.sequence_logprobs(space, table).exp()
    mean = float((p * scores).sum())
    return math.sqrt(max(float((p * (scores - mean) ** 2).sum()), 0.0))


def group_advantage_curve(
    scores: torch.Tensor, logprobs: torch.Tensor, group_size: int, *, eps: float = 1e-4,
    draws: int = GROUP_DRAWS, seed: int = 0,
) -> torch.Tensor:
    r"""GRPO's expected advantage of a sequence given its score, :math:`g_\pi(x) = \mathbb{E}\big[(x -
    \mu_G)/(\mathrm{std}_G + \varepsilon)\big]` over the other :math:`G - 1` members of its group drawn
    from :math:`\pi`; returned at every listed sequence's score, shape (V**T,).

    :math:`\mu_G` and :math:`\mathrm{std}_G` (with Bessel's correction, as TRL and verl) are the group's
    mean and std, the sequence itself included; a group whose scores all tie has advantage 0.
    Since the other members are independent of the sequence, GRPO's expected gradient is
    :math:`\mathbb{E}_\pi[g_\pi(s(y))\,\nabla\log\pi(y)]`: the score
    replaced by :math:`g_\pi(s)`, exactly. The expectation over the others is a quadrature by Monte Carlo
    with ``draws`` groups from a generator seeded with ``seed`` (common random numbers: the same uniforms at
    every call, mapped through :math:`\pi`'s score distribution, so that :math:`g_\pi` is a deterministic
    function of :math:`\pi`). It is evaluated once per distinct score.

    Parameters
    ----------
    scores : Tensor, shape (V**T,)
    logprobs : Tensor, shape (V**T,)
        :math:`\log\pi(y)`.
    group_size : int
        G >= 2.
    eps : float
        Added to the std (TRL's 1e-4).
    draws : int
        Groups in the quadrature.
    seed : int

    Returns
    -------
    Tensor, shape (V**T,)

    Examples
    --------
    Two equally likely scores and G = 2: the other member ties with probability 1/2 (advantage 0) and
    differs otherwise, when :math:`(x - \mu)/\mathrm{std} = \pm 1/\sqrt 2`:

    >>> g = group_advantage_curve(torch.tensor([0.0, 1.0], dtype=torch.float64),
    ...                           torch.tensor([0.5, 0.5], dtype=torch.float64).log(), 2)
    >>> exact = torch.tensor([-1.0, 1.0], dtype=torch.float64) / (2 * 2**0.5)  # -(1/2)(1/sqrt 2), ...
    >>> bool(torch.allclose(g, exact, atol=0.01))  # within the quadrature's error
    True
    """
    values, inverse = torch.unique(scores, return_inverse=True)  # (K,), (V**T,)
    p = torch.zeros_like(values).index_add_(0, inverse, logprobs.exp())  # (K,): pi's score distribution
    cdf = torch.cumsum(p, 0)
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(draws, group_size - 1, generator=gen, dtype=values.dtype) * cdf[-1]
    others = values[torch.searchsorted(cdf, u).clamp(max=len(values) - 1)]  # (M, G - 1)
    s1, s2 = others.sum(-1), others.pow(2).sum(-1)  # (M,)
    x = values[:, None]  # (K, 1)
    mean = (x + s1) / group_size  # (K, M)
    var = ((x.pow(2) + s2) - group_size * mean.pow(2)) / (group_size - 1)
    std = var.clamp(min=0).sqrt()
    adv = torch.where(std > 0, (x - mean) / (std + eps), torch.zeros_like(std))  # a tied group: no signal
    curve = adv.mean(-1)  # (K,)
    return curve[inverse]


def _group_size(spec: RecipeSpec, group_size: int | None) -> int | None:
    if spec.group_setting is None:
        if group_size is not None:
            raise ValueError(
                f"group_size applies only to a recipe with a group baseline; {spec.name} has none"
            )
        return None
    if group_size is None:
        return spec.settings.group_size
    g = check_positive_int(group_size, "group_size")
    if g < 2:
        raise ValueError(f"group_size must be at least 2 (a group baseline needs another sample), got {g}")
    return g


#: How a group-baseline recipe scales its advantage (TRL's ``scale_rewards``): not at all, by the group's
#: std, or by the whole batch's std.
ADVANTAGE_SCALES: tuple[str, ...] = ("none", "group", "batch")


def loss_fixed_point_table(
    space: ex.SequenceSpace, ref_table: torch.Tensor, scores: torch.Tensor, beta: float, *,
    divergence: str, group_size: int | None, scale: str = "none", eps: float = 1e-4,
) -> torch.Tensor:
    r"""The next-token table (P, V) where a group-baseline recipe with a per-token KL in the loss stops.

    The score's expected gradient is scaled as the module docstring says, and the penalty's follows the
    per-token ``divergence`` (``"forward"`` for k3, ``"reverse"`` for k2, k3+ or k3 weighted by the
    differentiable ratio):

    * ``scale="none"`` (Dr. GRPO): the per-token fixed point with :math:`c = \beta G/(G-1)`
      (:math:`c = \beta` without a group, ``group_size=None``);
    * ``"group"`` (GRPO): the score replaced by :math:`g_\pi(s)`, :math:`c = \beta`, solved
      self-consistently (:func:`group_advantage_curve`);
    * ``"batch"`` (TRL's ``scale_rewards="batch"``): the group-mean advantage divided by the std of the
      whole batch's scores, taken as the policy's own score std :math:`\sigma_\pi` (for a batch of B the
      difference is :math:`O(1/B)`: the batch std includes the sample, and Bessel's correction does not make
      the std unbiased), so :math:`c = \beta\,\sigma_\pi G/(G-1)`, also solved self-consistently.

    Raises ValueError for an unknown ``divergence`` or ``scale``.
    """
    beta = check_positive(beta, "beta")
    if divergence not in ("forward", "reverse"):
        raise ValueError(f"divergence must be 'forward' or 'reverse', got {divergence!r}")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {', '.join(ADVANTAGE_SCALES)}; got {scale!r}")
    if scale != "none" and group_size is None:
        raise ValueError(f"scale={scale!r} needs a group_size (the std-scaled advantage is a group's)")
    kappa = 1.0 if group_size is None else group_size / (group_size - 1)
    if scale == "none":
        return per_token_fixed_point(space, ref_table, scores, beta * kappa, divergence)
    if scale == "batch":
        sigma = score_std(space, ref_table, scores)
        for i in range(_STD_ITERATIONS):
            table = per_token_fixed_point(space, ref_table, scores, beta * kappa * (sigma + eps), divergence)
            new = score_std(space, table, scores)
            if abs(new - sigma) <= 1e-12:
                return table
            sigma = new if i < 50 else 0.5 * (sigma + new)
        raise RuntimeError(f"the batch-scaled fixed point did not settle in {_STD_ITERATIONS} iterations")
    ref_logprobs = ex.sequence_logprobs(space, ref_table)
    curve = group_advantage_curve(scores, ref_logprobs, group_size, eps=eps)
    for i in range(_STD_ITERATIONS):
        table = per_token_fixed_point(space, ref_table, curve, beta, divergence)
        new = group_advantage_curve(scores, ex.sequence_logprobs(space, table), group_size, eps=eps)
        if (new - curve).abs().max() <= 1e-10:
            return table
        curve = new if i < 50 else 0.5 * (curve + new)
    raise RuntimeError(f"the GRPO fixed point did not settle in {_STD_ITERATIONS} iterations")


def fixed_point_table(
    space: ex.SequenceSpace, ref_table: torch.Tensor, scores: torch.Tensor, recipe: str, beta: float,
    *, group_size: int | None = None,
) -> torch.Tensor:
    """The next-token table (P, V) of a recipe's fixed point on any listable space (the module docstring
    gives each one). Raises ValueError for the two recipes that have no stable one."""
    spec = get_recipe(recipe)
    beta = check_positive(beta, "beta")
    g = _group_size(spec, group_size)
    if spec.fixed_point is None:
        raise ValueError(f"{spec.name} has no stable fixed point with every token kept: {spec.why_none}")
    if spec.fixed_point == "optimum":
        ref_logprobs = ex.sequence_logprobs(space, ref_table)
        return ex.next_token_logprobs(space, ex.optimal_policy(ref_logprobs, scores, beta))
    return loss_fixed_point_table(
        space, ref_table, scores, beta, divergence=spec.fixed_point, group_size=g,
        scale="group" if spec.std_scaled else "none", eps=getattr(spec.settings, "eps", 1e-4),
    )


def recipe_fixed_point(
    task: ToyTask, recipe: str, beta: float, *, group_size: int | None = None
) -> torch.Tensor:
    r"""Log-probs (V**T,) of the policy at which ``recipe``'s expected on-policy gradient vanishes, on the
    toy task's proxy reward.

    Parameters
    ----------
    task : ToyTask
        Its reference and proxy reward (for a neural policy, the task of its run, whose reference is the
        fitted network: :attr:`~kltutorial.toyrlhf.recipes.RecipeResult.task`).
    recipe : str
        One of :data:`~kltutorial.toyrlhf.RECIPES`.
    beta : float
        :math:`\beta > 0`.
    group_size : int, optional
        G of a group baseline (default: the recipe's default); only for recipes that have one.

    Returns
    -------
    Tensor, shape (V**T,), float64

    Raises
    ------
    ValueError
        For an unknown recipe, :math:`\beta \le 0`, a group of fewer than 2, and the two recipes without a
        fixed point (``ppo-k3-reward``, ``dr-grpo-k1-loss``; the module docstring says why).
    """
    task = check_task(task)
    table = fixed_point_table(
        task.space, task.ref_table, task.proxy_reward, recipe, beta, group_size=group_size
    )
    return ex.sequence_logprobs(task.space, table)


def expected_gradient(
    space: ex.SequenceSpace, ref_table: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor,
    recipe: str, beta: float, *, group_size: int | None = None,
) -> torch.Tensor:
    r"""The recipe's expected on-policy gradient of its loss at the policy ``softmax(logits)``, exactly (a sum
    over every sequence), shape (P, V): what a very large batch would follow on its first step.

    Reward placements use :func:`~kltutorial.exact.placement.ppo_style_loss` with the exact critic
    (REINFORCE's and PPO's critics at their fixed point; RLOO's leave-one-out baseline is unbiased, which
    gives the same); loss placements use :func:`~kltutorial.exact.placement.grpo_style_loss` with the score
    scaled as the module docstring says (for GRPO by :math:`1/\sigma_\pi` of the policy at ``logits``).
    """
    spec = get_recipe(recipe)
    beta = check_positive(beta, "beta")
    g = _group_size(spec, group_size)
    theta = logits.detach().clone().requires_grad_(True)
    if spec.placement == "reward":
        lam = getattr(spec.settings, "lam", 1.0)
        loss = ppo_style_loss(space, theta, ref_table, scores, beta, estimator=spec.estimator, lam=lam)
    else:
        if spec.std_scaled:
            logp = ex.sequence_logprobs(space, torch.log_softmax(logits.detach(), -1))
            effective = group_advantage_curve(scores, logp, g, eps=spec.settings.eps)
        else:
            effective = scores if g is None else (g - 1) / g * scores
        # k3 weighted by the differentiable ratio (TRL's use_bias_correction_kl) has the expected
        # gradient of E_pi[k3], the per-token reverse KL's: k2's (grpo.py's module docstring)
        weighted = getattr(spec.settings, "kl_weight", "none") == "ratio" and spec.estimator == "k3"
        loss = grpo_style_loss(space, theta, ref_table, effective, beta,
                               estimator="k2" if weighted else spec.estimator)
    return torch.autograd.grad(loss, theta)[0]



@dataclass(frozen=True)
class FixedPointCurve:
    """The exact fixed points of one recipe across β: KL to the reference, expected rewards, and distance
    to :math:`\\pi^*_\\beta`; each array of shape (K,)."""

    recipe: str
    betas: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray
    kl_to_optimum: np.ndarray


def fixed_point_curve(task: ToyTask, recipe: str, betas: Sequence[float]) -> FixedPointCurve:
    """:func:`recipe_fixed_point` of ``recipe`` at every β of ``betas`` (default group size), summarised."""
    task = check_task(task)
    rows = []
    for beta in betas:
        fp = recipe_fixed_point(task, recipe, beta)
        opt = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, beta)
        rows.append((ex.sequence_kl(fp, task.ref_logprobs), ex.expected_reward(fp, task.proxy_reward),
                     ex.expected_reward(fp, task.gold_reward), ex.sequence_kl(fp, opt)))
    kl, proxy, gold, to_opt = (np.array(col) for col in zip(*rows, strict=True))
    return FixedPointCurve(recipe, np.asarray(betas, dtype=float), kl, proxy, gold, to_opt)
