r"""Where a per-token KL penalty in the loss stops the policy: the exact fixed points (book section 9).

With the KL in the reward and k1, the expected gradient is :math:`\nabla(\mathbb{E}[s] - \beta\,
\mathrm{KL}(\pi\|\pi_\mathrm{ref}))` and it vanishes at :math:`\pi^*_\beta(y) \propto \pi_\mathrm{ref}(y)\,
e^{s(y)/\beta}` (:func:`~kltutorial.exact.optimal_policy`). With a per-token penalty **in the loss**
(GRPO and its variants) the expected gradient at a prefix :math:`h` reached with positive probability is
:math:`\pi(h)` times

.. math::  c_s\,\pi(b\mid h)\,\big(Q(h, b) - V(h)\big) - \beta\,\frac{\partial}{\partial\theta_{hb}}
           D\big(\pi(\cdot\mid h), \pi_\mathrm{ref}(\cdot\mid h)\big),

where :math:`Q(h, b)` is the expected score after token :math:`b` under the policy itself,
:math:`V(h) = \sum_b \pi(b\mid h) Q(h, b)`, :math:`c_s` the scale the advantage puts on the score (1 for an
exact or leave-one-out baseline, :math:`(G-1)/G` for a group mean that includes the sample) and
:math:`D` the per-token divergence whose gradient the estimator follows (section 4). With softmax logits
:math:`\theta_h` and :math:`c = \beta / c_s` it vanishes where

* **reverse** per-token KL (k2, k1+, k3+ in the loss):
  :math:`\partial_{\theta_{hb}}\mathrm{KL}(\pi\|\pi_\mathrm{ref}) = \pi_b(\log\frac{\pi_b}{\rho_b} -
  \mathrm{KL})`, so :math:`\pi(b\mid h) \propto \pi_\mathrm{ref}(b\mid h)\,e^{Q(h, b)/c}`;
* **forward** per-token KL (k3 in the loss, GRPO's):
  :math:`\partial_{\theta_{hb}}\mathrm{KL}(\pi_\mathrm{ref}\|\pi) = \pi_b - \rho_b`, so
  :math:`\pi(b\mid h)\,(Q(h, b) - V(h)) = c\,(\pi(b\mid h) - \pi_\mathrm{ref}(b\mid h))`.

:math:`Q` at the last position is the score itself, and at earlier positions the value of the next prefix,
which depends only on the policy *after* it: both are solved by **backward induction** from the last
position, one level of prefixes at a time (:func:`per_token_fixed_point`).

The forward case has exactly one solution per prefix. Write :math:`\lambda = V(h) + c`: the condition reads
:math:`\pi_b = c\,\rho_b / (\lambda - Q_b)`, positive only for :math:`\lambda > \max_b Q_b`, and
:math:`f(\lambda) = \sum_b c\,\rho_b/(\lambda - Q_b)` falls strictly from :math:`+\infty` to 0 on
:math:`(\max_b Q_b, \infty)`, so :math:`f(\lambda) = 1` has one root, in
:math:`[\max_b Q_b + c\,\rho_{b^*}, \max_b Q_b + c]`. The root is consistent: :math:`\sum_b\pi_b Q_b =
\lambda - \sum_b \pi_b(\lambda - Q_b) = \lambda - c`, which is :math:`V(h)` as assumed. Every token keeps
positive probability: the forward KL covers the reference's mass.

Shapes: V vocabulary, T positions, V**T sequences, P prefix rows.
"""

from __future__ import annotations

from typing import Literal

import torch

from .._validation import check_choice, check_positive, check_table, check_values
from .space import SequenceSpace, check_space

__all__ = ["PER_TOKEN_DIVERGENCES", "per_token_fixed_point"]

Divergence = Literal["reverse", "forward"]

#: The per-token divergences whose fixed point :func:`per_token_fixed_point` solves.
PER_TOKEN_DIVERGENCES: tuple[str, ...] = ("reverse", "forward")

# Bisection steps for the forward case: the bracket has width c (1 - rho_max) < c, and 2**-80 of it is
# below float64's resolution of any root.
_BISECTIONS = 80


def _reverse_rows(ref_rows: torch.Tensor, q: torch.Tensor, coef: float) -> torch.Tensor:
    r"""Rows :math:`\log\pi(\cdot\mid h) = \log\mathrm{softmax}(\log\rho + Q/c)`; shapes (N, V)."""
    return torch.log_softmax(ref_rows + q / coef, dim=-1)


def _forward_rows(ref_rows: torch.Tensor, q: torch.Tensor, coef: float) -> torch.Tensor:
    r"""Rows :math:`\log\pi_b = \log(c\,\rho_b) - \log(\lambda - Q_b)` with :math:`\sum_b\pi_b = 1`."""
    rho = ref_rows.exp()  # (N, V)
    q_max, arg = q.max(dim=-1, keepdim=True)  # (N, 1)
    lo = q_max + coef * rho.gather(-1, arg)  # f(lo) >= 1: the largest token's term alone is 1 there
    hi = q_max + coef  # f(hi) <= sum_b c rho_b / c = 1
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        f = (coef * rho / (mid - q)).sum(-1, keepdim=True)  # f(mid), strictly decreasing in mid
        above = f > 1.0
        lo = torch.where(above, mid, lo)
        hi = torch.where(above, hi, mid)
    lam = 0.5 * (lo + hi)
    logp = torch.log(coef * rho) - torch.log(lam - q)
    return logp - torch.logsumexp(logp, dim=-1, keepdim=True)  # the root's last-bit error


def per_token_fixed_point(
    space: SequenceSpace,
    ref_table: torch.Tensor,
    scores: torch.Tensor,
    coef: float,
    divergence: Divergence = "reverse",
) -> torch.Tensor:
    r"""The policy at which a per-token KL penalty in the loss stops moving, by backward induction.

    From the last position to the first, for every prefix :math:`h` of that length:
    :math:`Q(h, b) = s(hb)` at the last position and :math:`V(hb)` before it; then

    * ``"reverse"``: :math:`\pi(b\mid h) \propto \pi_\mathrm{ref}(b\mid h)\,e^{Q(h, b)/c}`;
    * ``"forward"``: the one solution of :math:`\pi(b\mid h)(Q(h, b) - V(h)) = c\,(\pi(b\mid h) -
      \pi_\mathrm{ref}(b\mid h))` (the module docstring says why there is one);

    and :math:`V(h) = \sum_b \pi(b\mid h)\,Q(h, b)`. The expected gradient of the matching loss (score
    advantage scaled by :math:`c_s`, penalty :math:`\beta` times the per-token divergence) vanishes at every
    prefix when :math:`c = \beta/c_s`.

    Parameters
    ----------
    space : SequenceSpace
    ref_table : Tensor, shape (P, V)
        :math:`\log\pi_\mathrm{ref}(\cdot\mid h)`, one normalised row per prefix.
    scores : Tensor, shape (V**T,)
        The score :math:`s(y)` of every listed sequence, finite.
    coef : float
        :math:`c > 0`, the penalty's weight relative to the score.
    divergence : {"reverse", "forward"}
        The per-token KL the penalty's gradient follows: reverse for k2, k1+ and k3+ in the loss, forward for
        k3 in the loss.

    Returns
    -------
    Tensor, shape (P, V)
        The fixed point's next-token log-probs, in ``ref_table``'s dtype.

    Examples
    --------
    One position: the reverse case is :math:`\pi^*_c`, the forward case solves
    :math:`\pi_b (s_b - \mathbb{E}_\pi[s]) = c\,(\pi_b - \rho_b)`:

    >>> space = SequenceSpace(vocab_size=2, length=1)
    >>> ref = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    >>> s = torch.tensor([0.0, 1.0], dtype=torch.float64)
    >>> per_token_fixed_point(space, ref, s, 1.0).exp()  # 1 / (1 + e), e / (1 + e)
    tensor([[0.2689, 0.7311]], dtype=torch.float64)
    >>> p = per_token_fixed_point(space, ref, s, 1.0, "forward").exp()[0]
    >>> p  # pi_1 = (1 + sqrt(2)) / (2 + sqrt(2)) = 1 / sqrt(2)
    tensor([0.2929, 0.7071], dtype=torch.float64)
    >>> bool(torch.allclose(p * (s - (p * s).sum()), 1.0 * (p - 0.5)))
    True
    """
    space = check_space(space)
    ref_table = check_table(space, ref_table, "ref_table")
    scores = check_values(scores, "scores", space.n_sequences).to(ref_table.dtype)
    coef = check_positive(coef, "coef")
    check_choice(divergence, "divergence", PER_TOKEN_DIVERGENCES)
    solve = _reverse_rows if divergence == "reverse" else _forward_rows
    V, o = space.vocab_size, space.offsets
    table = torch.empty_like(ref_table)
    value = scores  # V(h) of the prefixes one level down; at the bottom, the whole sequences' scores
    for L in reversed(range(space.length)):
        q = value.reshape(V**L, V)  # (V**L, V): Q(h, b) = V(hb)
        rows = solve(ref_table[o[L] : o[L + 1]], q, coef)  # (V**L, V)
        table[o[L] : o[L + 1]] = rows
        value = (rows.exp() * q).sum(-1)  # (V**L,): V(h)
    return table
