r"""Samplers that are not the policy: the decoding settings that change the distribution tokens are
drawn from, as next-token log-prob rows (book section 12).

Part of :mod:`kltutorial.diagnostics`. Each function maps rows of next-token log-probabilities, shape
(..., V), to the rows of the distribution a generator with that setting samples from;
:func:`at_positions` applies one at chosen positions of a next-token table. Shapes: V vocabulary,
P prefixes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_float_tensor, check_positive, check_positive_int
from ..sequences import SequenceSpace

__all__ = [
    "top_k_logprobs",
    "top_p_logprobs",
    "temperature_logprobs",
    "ban_token_logprobs",
    "force_token_logprobs",
    "at_positions",
]


def _check_rows(logprobs: object, name: str = "logprobs") -> torch.Tensor:
    return check_float_tensor(logprobs, name, allow_inf=True)


def _renormalise(logprobs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, logprobs, torch.full_like(logprobs, -math.inf))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def top_k_logprobs(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k sampling's distribution: the ``k`` most likely tokens of each row, renormalised.

    .. math:: q(v) = \\frac{p(v)\\,[v \\in \\mathrm{top}_k(p)]}{\\sum_{u \\in \\mathrm{top}_k(p)} p(u)}

    Ties at the k-th place keep every tied token (Hugging Face's ``TopKLogitsWarper`` keeps the
    tokens whose logit is at least the k-th largest, so it does the same).

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
    k : int
        k >= 1; k >= V returns the rows unchanged.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> top_k_logprobs(torch.tensor([0.5, 0.3, 0.2]).log(), 2).exp()
    tensor([0.6250, 0.3750, 0.0000])
    """
    logprobs = _check_rows(logprobs)
    k = check_positive_int(k, "k")
    if k >= logprobs.shape[-1]:
        return logprobs
    kth = torch.topk(logprobs, k, dim=-1).values[..., -1:]  # (..., 1)
    return _renormalise(logprobs, logprobs >= kth)


def top_p_logprobs(logprobs: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus (top-p) sampling's distribution: the smallest set of most likely tokens with mass >= p.

    A token is kept when the mass of the tokens strictly more likely than it is below ``p`` (so the most
    likely token is always kept), as Holtzman et al. (2020) define the nucleus; the kept tokens are
    renormalised.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
    p : float
        In (0, 1]; 1 returns the rows unchanged.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> top_p_logprobs(torch.tensor([0.5, 0.3, 0.2]).log(), 0.7).exp()  # 0.5 < 0.7, 0.8 >= 0.7
    tensor([0.6250, 0.3750, 0.0000])
    """
    logprobs = _check_rows(logprobs)
    p = check_positive(p, "p")
    if p > 1:
        raise ValueError(f"p must lie in (0, 1], got {p}")
    if p == 1:
        return logprobs
    sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
    before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()  # mass of the more likely tokens
    keep_sorted = before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return _renormalise(logprobs, keep)


def temperature_logprobs(logprobs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling at a temperature: :math:`q(v) \\propto p(v)^{1/\\tau}`, i.e. ``log_softmax(logits / tau)``.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
        Log-probs (or logits: the result is the same).
    temperature : float
        :math:`\\tau > 0`; 1 returns the rows renormalised and otherwise unchanged.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> temperature_logprobs(torch.tensor([0.8, 0.2]).log(), 0.5).exp()  # 0.64 : 0.04
    tensor([0.9412, 0.0588])
    """
    logprobs = _check_rows(logprobs)
    temperature = check_positive(temperature, "temperature")
    return torch.log_softmax(logprobs / temperature, dim=-1)


def _check_token(token: object, vocab_size: int) -> int:
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab_size:
        raise ValueError(f"token must be an int in [0, {vocab_size}) (a token id), got {token!r}")
    return int(token)


def ban_token_logprobs(logprobs: torch.Tensor, token: int) -> torch.Tensor:
    """The rows with one token made impossible and the rest renormalised, as a minimum length bans the
    end token: :math:`q(v) = p(v)\\,[v \\ne e] / (1 - p(e))`.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
    token : int
        The banned token e.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> ban_token_logprobs(torch.tensor([0.5, 0.3, 0.2]).log(), 0).exp()
    tensor([0.0000, 0.6000, 0.4000])
    """
    logprobs = _check_rows(logprobs)
    token = _check_token(token, logprobs.shape[-1])
    keep = torch.ones_like(logprobs, dtype=torch.bool)
    keep[..., token] = False
    if not (torch.isfinite(logprobs) & keep).any(-1).all():
        raise ValueError(f"a row puts all its mass on token {token}: banning it leaves nothing to sample")
    return _renormalise(logprobs, keep)


def force_token_logprobs(logprobs: torch.Tensor, token: int) -> torch.Tensor:
    """Rows that always produce one token, as a generator that appends a forced end token:
    :math:`q(v) = [v = e]`.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
        Used for its shape and dtype.
    token : int
        The forced token e.

    Returns
    -------
    Tensor, shape (..., V)
        0 at ``token``, ``-inf`` elsewhere.

    Examples
    --------
    >>> force_token_logprobs(torch.zeros(3), 1).exp()
    tensor([0., 1., 0.])
    """
    logprobs = _check_rows(logprobs)
    token = _check_token(token, logprobs.shape[-1])
    out = torch.full_like(logprobs, -math.inf)
    out[..., token] = 0.0
    return out


def at_positions(
    space: SequenceSpace, table: torch.Tensor, positions: Sequence[int], other: torch.Tensor
) -> torch.Tensor:
    """A next-token table that follows ``other`` at the given positions and ``table`` everywhere else.

    Position t uses the rows of the prefixes of length t, ``space.offsets[t]`` to
    ``space.offsets[t + 1] - 1``. So ``at_positions(space, pi, [0, 1], ban_token_logprobs(pi, e))`` is
    the policy with token e banned at the first two positions (a minimum length of 2, e the end token),
    and ``at_positions(space, pi, [0], ref)`` draws the first token from the reference (a prompt from
    the data) and the rest from the policy.

    Parameters
    ----------
    space : SequenceSpace
    table, other : Tensor, shape (P, V)
    positions : sequence of int
        Each in [0, T).

    Returns
    -------
    Tensor, shape (P, V)
        A new tensor.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> at_positions(space, torch.zeros(3, 2), [1], torch.ones(3, 2))  # rows 1, 2: length-1 prefixes
    tensor([[0., 0.],
            [1., 1.],
            [1., 1.]])
    """
    if not isinstance(space, SequenceSpace):
        raise TypeError(f"space must be a SequenceSpace, got {type(space).__name__}")
    table = check_float_tensor(table, "table", ndim=2, allow_inf=True)
    other = check_float_tensor(other, "other", ndim=2, allow_inf=True)
    want = (space.n_prefixes, space.vocab_size)
    for name, x in (("table", table), ("other", other)):
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must have shape {want}, one row per prefix; got {tuple(x.shape)}")
    out = table.clone()
    for t in positions:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < space.length:
            raise ValueError(f"positions must be ints in [0, {space.length}), got {t!r}")
        rows = slice(space.offsets[t], space.offsets[t + 1])
        out[rows] = other[rows]
    return out
