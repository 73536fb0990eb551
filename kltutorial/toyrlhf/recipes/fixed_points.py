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
  solved self-consistently, :math:`g = F(g)` with :math:`F: g \to` the fixed point of :math:`g \to` its
  :math:`g_\pi`, by Anderson acceleration from :math:`\pi_\mathrm{ref}` (:func:`loss_fixed_point_table`);
  :math:`g_\pi` is computed exactly or by a quadrature continuous in :math:`\pi`, so that the fixed point
  exists. For a large group :math:`g_\pi(x) \to (x - \mathbb{E}_\pi s)/\sigma_\pi`;
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ... import exact as ex
from ..._validation import check_choice, check_coef, check_positive, check_positive_int, check_seed
from ...exact.fixed_points import per_token_fixed_point
from ...exact.placement import grpo_style_loss, ppo_style_loss
from ..task import ToyTask, check_task
from .registry import RecipeSpec, get_recipe

__all__ = ["GROUP_DRAWS", "GROUP_EXACT_CELLS", "GROUP_METHODS", "ADVANTAGE_SCALES", "recipe_fixed_point",
           "kl_to_fixed_points",
           "fixed_point_table", "loss_fixed_point_table",
           "expected_gradient", "score_std", "group_advantage_curve", "FixedPointCurve", "fixed_point_curve"]

#: Groups (scrambled Sobol points) in the quadrature of GRPO's expected advantage where it is not summed
#: exactly (:func:`group_advantage_curve`); a power of two, as Sobol points want.
GROUP_DRAWS: int = 4096

#: :func:`group_advantage_curve` sums over every group exactly when :math:`K\binom{K + G - 2}{G - 1}` (K
#: distinct scores times the multisets of the other G - 1 members' scores) is at most this: 64 MiB of float64.
GROUP_EXACT_CELLS: int = 2**23

# A member's window in the quadrature has half-width h = _WINDOW / (2 (G - 1) K): it covers a boundary
# between two of the K categories with probability at most 2hK, so a group expands into at most
# (1 + 2hK)^(G-1) <= e^_WINDOW = 2.1 choices on average, whatever pi. Wider windows make g_pi smoother (its
# fixed point easier to find) and cost more: with 1.5 the hardest settings of the book's task took no fewer
# iterations than with 0.75, and each cost more.
_WINDOW = 0.75

# The batch-scaled fixed point (a scalar, sigma_pi) by damped iteration.
_STD_ITERATIONS = 200

# The GRPO fixed point g = F(g) (F: g -> the per-token fixed point of g -> its g_pi) by Anderson acceleration
# over the last _ANDERSON_MEMORY steps (chosen among 3, 5, 8, 12 and 20 on the hardest settings of the book's
# task), with a plain step and a new history where the extrapolation would go more than _ANDERSON_REACH times
# as far as the plain step (it went to 1e25 without). Its path is erratic far from the point (the plain
# iteration can circle it for ever), and the number of steps varies from 10 to 300 with the start; so when
# the residual has not halved in _ANDERSON_STALL steps it starts again from another policy (_anderson). It
# stops once g moves by at most _GROUP_TOL, a hundredth of the 1e-10 promised, so that the expected gradient
# at the point is below 1e-13.
_GROUP_ITERATIONS = 500
_ANDERSON_MEMORY = 8
_ANDERSON_REACH = 10.0
_ANDERSON_STALL = 40
_GROUP_TOL = 1e-12


def score_std(space: ex.SequenceSpace, table: torch.Tensor, scores: torch.Tensor) -> float:
    """The std of the score under the policy with next-token table ``table``, exactly."""
    p = ex.sequence_logprobs(space, table).exp()
    mean = float((p * scores).sum())
    return math.sqrt(max(float((p * (scores - mean) ** 2).sum()), 0.0))


# --------------------------------------------------------------------------------------------------------
# GRPO's expected advantage g_pi: exactly, or by a quadrature continuous in pi


def _score_masses(scores: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                        torch.Tensor]:
    """The distinct scores (K,) in increasing order, each sequence's index among them (V**T,), and pi's mass
    on each (K,), normalised."""
    values, inverse = torch.unique(scores, return_inverse=True)  # (K,), (V**T,)
    p = torch.zeros_like(values).index_add_(0, inverse, logprobs.exp())
    return values, inverse, p / p.sum()


def _group_moments(others: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The mean :math:`\bar z` and the sum of squares about it :math:`T = \sum_j (z_j - \bar z)^2` of each
    group's other members (C, m); (C,) each. A tie's mean is its score exactly."""
    lo, hi = others.min(-1).values, others.max(-1).values
    zbar = torch.where(lo == hi, lo, others.mean(-1))
    return zbar, (others - zbar[:, None]).pow(2).sum(-1)


def _group_advantages(values: torch.Tensor, zbar: torch.Tensor, t2: torch.Tensor, m: int,
                      eps: float) -> torch.Tensor:
    r"""The advantage (K, C) of a member scoring each of ``values`` (K,) in each group whose :math:`m = G - 1`
    other members have mean ``zbar`` and sum of squares ``t2`` (C,) (:func:`_group_moments`).

    The group's mean is :math:`\mu = (x + m\bar z)/G`, so :math:`x - \mu = \frac mG(x - \bar z)`, and its sum
    of squares is :math:`T + \frac mG(x - \bar z)^2`:

    .. math::  a = \frac mG (x - \bar z)\Big/\Big(\sqrt{\big(T + \tfrac mG (x - \bar z)^2\big)/(G - 1)}
               + \varepsilon\Big),

    with no large terms cancelling (two scores 4e-6 apart keep their digits). A tied group (every
    :math:`z_j = x`) gets 0 exactly.
    """
    G = m + 1
    dev = values[:, None] - zbar  # (K, C)
    denom = dev.square().mul_(m / G).add_(t2).div_(G - 1).sqrt_().add_(eps)  # in place: (K, C) is the cost
    adv = dev.mul_(m / G).div_(denom)
    return adv if eps > 0 else torch.nan_to_num(adv, nan=0.0)  # eps = 0 and a tie: 0 / 0


def _multisets(K: int, m: int) -> torch.Tensor:
    """Every multiset of m of range(K): non-decreasing rows (C(K + m - 1, m), m), in lexicographic order."""
    rows = torch.arange(K)[:, None]  # (K, 1)
    for _ in range(m - 1):
        last = rows[:, -1]
        counts = K - last  # each row continues with any index >= its last
        starts = torch.cumsum(counts, 0) - counts
        nxt = torch.arange(int(counts.sum())) - torch.repeat_interleave(starts - last, counts)
        rows = torch.cat([torch.repeat_interleave(rows, counts, 0), nxt[:, None]], 1)
    return rows


def _log_multinomial(rows: torch.Tensor) -> torch.Tensor:
    r""":math:`\log\big(m!/\prod_k n_k!\big)` of each non-decreasing row (R, m), :math:`n_k` its counts."""
    run = torch.ones(rows.shape[0], dtype=torch.float64)  # position within the current run of equal indices
    log_fact = torch.zeros(rows.shape[0], dtype=torch.float64)  # sum_k log n_k!, one factor at a time
    for j in range(1, rows.shape[1]):
        run = torch.where(rows[:, j] == rows[:, j - 1], run + 1, torch.ones_like(run))
        log_fact += run.log()
    return math.lgamma(rows.shape[1] + 1) - log_fact


def _tent_cdf(s: torch.Tensor, h: float) -> torch.Tensor:
    """The CDF at ``s`` of the triangular density of half-width ``h`` centred on 0: once differentiable."""
    t = (s / h).clamp(-1, 1)
    return torch.where(t <= 0, (1 + t).square() / 2, 1 - (1 - t).square() / 2)


def _window_groups(values: torch.Tensor, p: torch.Tensor, u: torch.Tensor, h: float) -> tuple[
        torch.Tensor, torch.Tensor]:
    r"""The groups of the quadrature, expanded over their windows: scores (C, m) and weights (C,).

    Member j of group i draws from the categories :math:`[c_{k-1}, c_k)` of the inverse CDF of the masses
    ``p`` (K,) that the triangular window of half-width ``h`` centred on ``u[i, j]`` (modulo 1) covers, each
    with the window's mass on it, :math:`T(c_k - u) - T(c_{k-1} - u)` (:func:`_tent_cdf`); the group
    becomes every choice of one category per member, weighted by the product. The weights are once
    differentiable in the :math:`c_k`, so in ``p``: a category enters a window with weight and slope 0.
    """
    M, m = u.shape
    hi = torch.cumsum(p, 0)
    hi = hi / hi[-1]  # c_k, the categories' upper ends
    ext_hi = torch.cat([hi - 1, hi, hi + 1])  # (3K,): the CDF unrolled over [-1, 2), for windows that wrap
    ext_lo = torch.cat([ext_hi.new_full((1,), -1.0), ext_hi[:-1]])  # c_{k-1}: the weights telescope to 1
    first = torch.searchsorted(ext_hi, u - h, right=True)  # (M, m): the category where each window starts
    count = torch.searchsorted(ext_hi, u + h) - first + 1  # and how many it covers
    group = torch.arange(M)  # (C,): the group of each partial choice, extended member by member
    weight = torch.ones(M, dtype=p.dtype)
    cats = []
    for j in range(m):
        n = count[group, j]
        parent = torch.repeat_interleave(torch.arange(len(group)), n)
        rank = torch.arange(len(parent)) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)  # in its window
        k = first[group[parent], j] + rank
        group, cats = group[parent], [c[parent] for c in cats] + [k]
        at = u[group, j]
        weight = weight[parent] * (_tent_cdf(ext_hi[k] - at, h) - _tent_cdf(ext_lo[k] - at, h))
    keep = weight > 0  # a zero-mass category inside a window, or one the window only touches
    ext_v = values.repeat(3)
    return ext_v[torch.stack(cats, 1)[keep]], weight[keep]


#: How :func:`group_advantage_curve` sums over the groups.
GROUP_METHODS: tuple[str, ...] = ("auto", "exact", "quadrature")


def _group_rule(values: torch.Tensor, group_size: int, *, eps: float, draws: int, seed: int,
                method: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The map from pi's masses on the distinct scores ``values`` (K,) to g_pi at each of them (K,); what
    does not depend on pi (the enumerated groups, the Sobol points) is built once, here."""
    K, m = len(values), group_size - 1
    if method == "exact" or (method == "auto" and K * math.comb(K + m - 1, m) <= GROUP_EXACT_CELLS):
        rows = _multisets(K, m)  # (R, m)
        log_coef = _log_multinomial(rows)  # (R,)
        adv = _group_advantages(values, *_group_moments(values[rows]), m, eps)  # (K, R): fixed; p weighs it

        def exact(p: torch.Tensor) -> torch.Tensor:
            log_p = p.log()
            log_w = log_coef.clone()
            for j in range(m):  # the multinomial probability of each multiset, one member at a time
                log_w += log_p[rows[:, j]]
            return (adv * log_w.exp()).sum(-1)  # not adv @ w: MKL's gemv rounds by the operands' alignment

        return exact
    if m <= torch.quasirandom.SobolEngine.MAXDIM:
        u = torch.quasirandom.SobolEngine(m, scramble=True, seed=seed).draw(draws, dtype=values.dtype)
    else:  # Sobol points go to 21,201 dimensions; a larger group gets pseudo-random ones
        u = torch.rand(draws, m, generator=torch.Generator().manual_seed(seed), dtype=values.dtype)
    h = 0.5 * _WINDOW / (m * K)
    chunk = max(1, 2**17 // K)  # groups per (K, chunk) block: 1 MiB stays in cache, 3x faster than one block

    def quadrature(p: torch.Tensor) -> torch.Tensor:
        z, weight = _window_groups(values, p, u, h)  # (C, m), (C,)
        zbar, t2 = _group_moments(z)
        curve = torch.zeros_like(values)
        for i in range(0, len(weight), chunk):
            adv = _group_advantages(values, zbar[i : i + chunk], t2[i : i + chunk], m, eps)
            curve += adv.mul_(weight[i : i + chunk]).sum(-1)  # not adv @ weight (MKL's gemv: see above)
        return curve / draws

    return quadrature


def group_advantage_curve(
    scores: torch.Tensor, logprobs: torch.Tensor, group_size: int, *, eps: float = 1e-4,
    draws: int = GROUP_DRAWS, seed: int = 0, method: str = "auto",
) -> torch.Tensor:
    r"""GRPO's expected advantage of a sequence given its score, :math:`g_\pi(x) = \mathbb{E}\big[(x -
    \mu_G)/(\mathrm{std}_G + \varepsilon)\big]` over the other :math:`G - 1` members of its group drawn
    from :math:`\pi`; returned at every listed sequence's score, shape (V**T,).

    :math:`\mu_G` and :math:`\mathrm{std}_G` (with Bessel's correction, as TRL and verl) are the group's
    mean and std, the sequence itself included; a group whose scores all tie has advantage 0.
    Since the other members are independent of the sequence, GRPO's expected gradient is
    :math:`\mathbb{E}_\pi[g_\pi(s(y))\,\nabla\log\pi(y)]`: the score replaced by :math:`g_\pi(s)`, exactly.

    The others matter only through the multiset of their scores. With :math:`v_1 < \dots < v_K` the distinct
    scores and :math:`p_k` their masses under :math:`\pi`,

    .. math::  g_\pi(x) = \sum_{n_1 + \dots + n_K = G - 1} \frac{(G-1)!}{\prod_k n_k!}\prod_k p_k^{n_k}\,
               a(x; n),

    with :math:`a(x; n)` the advantage of :math:`x` in the group whose others are :math:`n_k` copies of each
    :math:`v_k`: a polynomial in :math:`p`. ``method="exact"`` sums it over all :math:`\binom{K + G - 2}{G -
    1}` multisets, ``"auto"`` does so when :math:`K\binom{K + G - 2}{G - 1} \le`
    :data:`~kltutorial.toyrlhf.recipes.fixed_points.GROUP_EXACT_CELLS` (on the book's task, K = 792:
    G = 2 only; on a space of 9 sequences: every G up to 16).

    Otherwise (``"quadrature"``) a quasi-Monte Carlo average over ``draws`` groups that is continuous in
    :math:`\pi`, so that the self-consistent fixed point of
    :func:`~kltutorial.toyrlhf.recipes.fixed_points.loss_fixed_point_table` exists and its iteration
    settles. A member is drawn by the inverse CDF, :math:`s(u) = v_k` for :math:`u \in [c_{k-1}, c_k)`,
    :math:`c_k = p_1 + \dots + p_k`, at scrambled Sobol points :math:`u \in [0, 1)^{G-1}` (``seed``; the
    same at every call). Such draws jump from one score to the next when a boundary :math:`c_k` crosses a
    point, which made the Monte Carlo curve this package used before piecewise constant in :math:`\pi`, and
    its fixed-point iteration cycle on 9 to 13 of the 40 settings of the book's task (by the machine's
    rounding). Here each member is the
    mixture of the categories under a triangular window of half-width :math:`h = 0.375/((G - 1)K)` centred
    on its point (modulo 1), each weighted by the window's mass on it, and the group is expanded over every
    choice of one category per member (weights multiplied):

    * continuous: the weights are once differentiable functions of the :math:`c_k`; a category enters a
      window with weight and slope 0, and the expansion is exact, so no score jumps;
    * unbiased: averaged over a uniform :math:`u`, a window gives each category exactly its mass
      :math:`p_k`, so this is an ordinary (randomised) quasi-Monte Carlo rule for a smoothed integrand;
    * cheap: a window covers a boundary with probability :math:`2hK` at most, so a group expands into at most
      :math:`(1 + 2hK)^{G-1} \le e^{0.75}` choices on average, whatever :math:`\pi` (about 8,000 for the
      4,096 groups).

    Accuracy, measured on the book's task (V = 8, T = 5, 792 distinct proxy scores) at
    :math:`\pi_\mathrm{ref}` and at the forward per-token fixed points with c = 1, 0.1 and 0.01, as the
    largest :math:`|g - g_\mathrm{exact}|` over the 792 scores (with the Monte Carlo curve of 4,000 groups
    used before in brackets): G = 2, against the exact sum, 1.2e-4 (1.3e-2); G = 3, against the exact sum
    over its 314,028 multisets, 7.5e-4 (1.1e-2); G = 4, 8 and 16, against this quadrature with 2^17 groups
    and another seed, 5.7e-4 (2.1e-2), 6.7e-4 (9.5e-3) and 1.3e-3 (1.0e-2), the last at c = 0.01, where
    few groups do not tie. One call takes 40-70 ms there (one CPU thread).

    Parameters
    ----------
    scores : Tensor, shape (V**T,)
    logprobs : Tensor, shape (V**T,)
        :math:`\log\pi(y)`.
    group_size : int
        G >= 2.
    eps : float
        Added to the std (TRL's 1e-4), >= 0.
    draws : int
        Groups in the quadrature.
    seed : int
        Of the scrambled Sobol points.
    method : {"auto", "exact", "quadrature"}
        ``"exact"`` costs :math:`K\binom{K + G - 2}{G - 1}` in time and memory.

    Returns
    -------
    Tensor, shape (V**T,)

    Examples
    --------
    Two equally likely scores and G = 2: the other member ties with probability 1/2 (advantage 0) and
    differs otherwise, when the advantage is :math:`\pm\tfrac12/(1/\sqrt 2 + \varepsilon)`:

    >>> s = torch.tensor([0.0, 1.0], dtype=torch.float64)
    >>> half = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> group_advantage_curve(s, half, 2)  # exact: (1/2)(1/2)/(1/sqrt 2 + 1e-4) = 0.3535
    tensor([-0.3535,  0.3535], dtype=torch.float64)
    >>> quad = group_advantage_curve(s, half, 2, method="quadrature")
    >>> bool((quad - group_advantage_curve(s, half, 2)).abs().max() < 1e-3)
    True
    """
    group_size = check_positive_int(group_size, "group_size")
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (a group needs another member), got {group_size}")
    eps = check_coef(eps, "eps")
    draws = check_positive_int(draws, "draws")
    seed = check_seed(seed)
    check_choice(method, "method", GROUP_METHODS)
    values, inverse, p = _score_masses(scores, logprobs)
    rule = _group_rule(values, group_size, eps=eps, draws=draws, seed=seed, method=method)
    return rule(p)[inverse]


def _least_squares(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r""":math:`\arg\min_x \|a x - b\|` for a (K, n) of few columns, by modified Gram-Schmidt; a column within
    1e-10 (relatively) of the span of those before it is dropped (its coefficient 0). Written with torch's
    own sums: LAPACK's ``lstsq`` through MKL rounds differently by the operands' alignment in memory, and the
    iteration it steers would then differ from run to run."""
    n = a.shape[1]
    qs: list[torch.Tensor] = []
    kept: list[int] = []
    R = torch.zeros(n, n, dtype=a.dtype)
    for j in range(n):
        v = a[:, j].clone()
        for i, q in enumerate(qs):
            R[i, len(qs)] = (q * v).sum()
            v -= R[i, len(qs)] * q
        norm = v.square().sum().sqrt()
        if norm > 1e-10 * a[:, j].square().sum().sqrt():
            R[len(qs), len(qs)] = norm
            qs.append(v / norm)
            kept.append(j)
    y = [float((q * b).sum()) for q in qs]  # Q^T b, then R x = Q^T b from the bottom up
    x = [0.0] * len(qs)
    for i in reversed(range(len(qs))):
        x[i] = (y[i] - sum(float(R[i, k]) * x[k] for k in range(i + 1, len(qs)))) / float(R[i, i])
    out = torch.zeros(n, dtype=a.dtype)
    out[kept] = torch.tensor(x, dtype=a.dtype)
    return out


def _anderson(step: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
              starts: Sequence[Callable[[], torch.Tensor]]) -> tuple[torch.Tensor, int]:
    r"""Solve :math:`g = F(g)` by Anderson acceleration (type II, mixing 1; Walker and Ni 2011, SIAM J.
    Numer. Anal. 49, 1715), where ``step(g)`` returns :math:`F(g)` and the table it came from. Returns the
    table at the first :math:`g` with :math:`\max|F(g) - g| \le` ``_GROUP_TOL`` and the iterations taken.

    1. Start from ``starts[0]()``.
    2. Each step goes to :math:`g + r - (\Delta G + \Delta R)\gamma`, with :math:`r = F(g) - g`, the
       columns of :math:`\Delta G`, :math:`\Delta R` the last differences of the iterates and residuals, and
       :math:`\gamma` the least-squares solution of :math:`\Delta R\,\gamma = r`: the secant step of the
       last ``_ANDERSON_MEMORY`` steps. With no history, or where that step would go more than
       ``_ANDERSON_REACH`` times as far as :math:`r`, it is the plain step :math:`g + r = F(g)`, and the
       history starts again.
    3. When :math:`\max|r|` has not halved in ``_ANDERSON_STALL`` steps, start again from the next of
       ``starts`` (cyclically), with no history.
    """
    gs: list[torch.Tensor] = []
    rs: list[torch.Tensor] = []
    g, best, stalled, restarts = starts[0](), math.inf, 0, 0
    for i in range(_GROUP_ITERATIONS):
        new, table = step(g)
        r = new - g
        res = float(r.abs().max())
        if res <= _GROUP_TOL:
            return table, i + 1
        best, stalled = (res, 0) if res < best / 2 else (best, stalled + 1)
        if stalled == _ANDERSON_STALL:  # 3.
            restarts += 1
            g, best, stalled = starts[restarts % len(starts)](), math.inf, 0
            gs.clear()
            rs.clear()
            continue
        gs.append(g)  # 2.
        rs.append(r)
        del gs[: -_ANDERSON_MEMORY - 1], rs[: -_ANDERSON_MEMORY - 1]
        move = r
        if len(gs) > 1:
            dg = torch.stack([b - a for a, b in zip(gs, gs[1:], strict=False)], 1)  # (K, n)
            dr = torch.stack([b - a for a, b in zip(rs, rs[1:], strict=False)], 1)
            move = r - ((dg + dr) * _least_squares(dr, r)).sum(1)  # not @: MKL's gemv rounds by alignment
            if float(move.abs().max()) > _ANDERSON_REACH * res:  # an extrapolation gone astray
                move = r
                gs.clear()
                rs.clear()
        g = g + move
    raise RuntimeError(
        f"the GRPO fixed point did not settle in {_GROUP_ITERATIONS} iterations ({restarts} restarts; "
        f"max |F(g) - g| = {res:.1e} > {_GROUP_TOL:g})"
    )


def _grpo_fixed_point(space: ex.SequenceSpace, ref_table: torch.Tensor, scores: torch.Tensor, beta: float,
                      divergence: str, group_size: int, eps: float) -> tuple[torch.Tensor, int]:
    r"""GRPO's self-consistent fixed point: the per-token fixed point of :math:`g_\pi` at which
    :math:`g_\pi` is evaluated; its table (P, V) and the iterations taken."""
    values, inverse = torch.unique(scores, return_inverse=True)  # (K,), (V**T,)
    rule = _group_rule(values, group_size, eps=eps, draws=GROUP_DRAWS, seed=0, method="auto")

    def curve_at(table: torch.Tensor) -> torch.Tensor:  # (K,): g_pi at the policy `table`
        return rule(_score_masses(scores, ex.sequence_logprobs(space, table))[2])

    def step(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        table = per_token_fixed_point(space, ref_table, g[inverse], beta, divergence)
        return curve_at(table), table

    def start_at(coef: float) -> Callable[[], torch.Tensor]:  # g_pi at the fixed point of the raw score
        return lambda: curve_at(per_token_fixed_point(space, ref_table, scores, coef, divergence))

    starts = [lambda: curve_at(ref_table), start_at(beta), start_at(beta / 10), start_at(beta * 10)]
    return _anderson(step, starts)


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
      self-consistently (below);
    * ``"batch"`` (TRL's ``scale_rewards="batch"``): the group-mean advantage divided by the std of the
      whole batch's scores, taken as the policy's own score std :math:`\sigma_\pi` (for a batch of B the
      difference is :math:`O(1/B)`: the batch std includes the sample, and Bessel's correction does not make
      the std unbiased), so :math:`c = \beta\,\sigma_\pi G/(G-1)`, also solved self-consistently (a damped
      iteration on the scalar :math:`\sigma_\pi`).

    GRPO's point solves :math:`g = F(g)` on the K distinct scores, where :math:`F(g)` is
    :func:`group_advantage_curve` (exact where it is cheap, else its quadrature, continuous in :math:`\pi`)
    at the per-token fixed point of the score :math:`g`. The iteration starts from
    :math:`g_{\pi_\mathrm{ref}}` and is accelerated by Anderson's method (type II, the last 8 steps; Walker
    and Ni 2011), as the plain iteration :math:`g \to F(g)` can circle the point for ever (for the reverse
    divergence at :math:`\beta \approx 0.2`-0.3 it goes round a loop from 1 to 12 nats of KL); where it
    stalls, it starts again from the per-token fixed point of the raw score with :math:`c = \beta`,
    :math:`\beta/10` or :math:`10\beta`. It stops once
    :math:`\max|F(g) - g| \le 10^{-12}` and returns the fixed point of that :math:`g`; there the expected
    gradient of GRPO's loss (:func:`expected_gradient`) is below 1e-13. On the book's task the 40 settings
    of G in {2, 4, 8, 16}, :math:`\beta` in {0.01, 0.04, 0.1, 0.3, 1} and both divergences settle in 4 to 54
    iterations, 0.1 to 5 s each (35 to 51 s in all, one CPU thread, by the machine's load); a wider sweep (G
    from 2 to 32, 12 :math:`\beta` from 0.001 to 3, both divergences: 240 settings) took 11.5 iterations at
    the median and at most 175 (G = 16, :math:`\beta` = 0.34, reverse). From four starts
    (:math:`\pi_\mathrm{ref}` and three per-token fixed points of the score) each of the 40 reaches the same
    point, to 1e-15 nats; where the quadrature is used, its point is unique only up to the quadrature's
    error: for G = 3, :math:`\beta` = 0.2, reverse, the starts reach points up to 6e-6 nats apart.

    Parameters
    ----------
    space : SequenceSpace
    ref_table : Tensor, shape (P, V)
        :math:`\log\pi_\mathrm{ref}(\cdot\mid h)`.
    scores : Tensor, shape (V**T,)
    beta : float
        :math:`\beta > 0`.
    divergence : {"forward", "reverse"}
    group_size : int or None
        G >= 2 of a group baseline; None for none (only with ``scale="none"``).
    scale : {"none", "group", "batch"}
        How the advantage is scaled (TRL's ``scale_rewards``).
    eps : float
        Added to the std (TRL's 1e-4).

    Returns
    -------
    Tensor, shape (P, V)

    Raises
    ------
    ValueError
        For an unknown ``divergence`` or ``scale``, or a scaled advantage without a group.
    RuntimeError
        If the self-consistent iteration (``"group"``: 500 steps; ``"batch"``: 200) does not settle. Not seen
        on the book's task (the settings above) nor on small random tasks (V**T <= 27, G <= 16, 900 settings);
        it could still happen where :math:`F` has no point the iteration reaches.
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
    if check_positive_int(group_size, "group_size") < 2:
        raise ValueError(f"group_size must be at least 2 (a group needs another member), got {group_size}")
    eps = check_coef(eps, "eps")
    return _grpo_fixed_point(space, ref_table, scores, beta, divergence, group_size, eps)[0]


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


def kl_to_fixed_points(
    task: ToyTask, recipe: str, logprobs: torch.Tensor, beta: float, *, group_size: int | None = None
) -> tuple[float, float]:
    r"""Where a policy ``logprobs`` (V**T,) stands against the two points of ``recipe`` at ``beta``: its exact
    KL to the recipe's own fixed point (:func:`recipe_fixed_point`; NaN for the recipes without a stable
    one, whose ``stability`` says why) and to :math:`\pi^*_\beta`, as ``(to_own, to_optimum)`` in nats.

    Raises
    ------
    ValueError
        For an unknown recipe, :math:`\beta \le 0` or a group of fewer than 2.
    """
    task = check_task(task)
    beta = check_positive(beta, "beta")
    to_own = float("nan")
    if get_recipe(recipe).fixed_point is not None:
        fixed = recipe_fixed_point(task, recipe, beta, group_size=group_size)
        to_own = float(ex.sequence_kl(logprobs, fixed))
    optimum = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, beta)
    return to_own, float(ex.sequence_kl(logprobs, optimum))


def expected_gradient(
    space: ex.SequenceSpace, ref_table: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor,
    recipe: str, beta: float, *, group_size: int | None = None,
) -> torch.Tensor:
    r"""The recipe's expected on-policy gradient of its loss at the policy ``softmax(logits)``, exactly (a sum
    over every sequence), shape (P, V): what a very large batch would follow on its first step.

    Reward placements use :func:`~kltutorial.exact.placement.ppo_style_loss` with the exact critic
    (REINFORCE's and PPO's critics at their fixed point; RLOO's leave-one-out baseline is unbiased, which
    gives the same); loss placements use :func:`~kltutorial.exact.placement.grpo_style_loss` with the score
    scaled as the module docstring says (for GRPO replaced by :math:`g_\pi(s)` of the policy at ``logits``,
    :func:`group_advantage_curve`).
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
