"""TRL's names over the package's code: the KL controllers of ``trl/trainer/utils.py`` and the KL penalty and
reward shaping of ``PPOTrainer`` (``_kl_penalty``, ``compute_rewards``) as functions (v0.11.4), and its
log-prob functions, ``selective_log_softmax`` (``trl/trainer/utils.py``, v0.14 to today) and
``logprobs_from_logits`` (``trl/core.py``, up to v0.11).

``AdaptiveKLController(init_kl_coef, target, horizon)`` with ``update(current, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value``. ``kl_penalty(logprob,
ref_logprob, kl_penalty="kl")`` takes TRL's names ``kl``, ``abs``, ``mse`` and ``full`` (for ``full`` the
arguments are full log-softmax tensors, (..., V)); ``compute_rewards(scores, logprobs, ref_logprobs,
masks, kl_coef, kl_penalty="kl")`` returns TRL's ``(rewards, non_score_rewards, kls)``, with TRL's padding
convention: ``-kl_coef * kl`` is left at every position, padding included (mask the result, or use
:func:`~kltutorial.objective.shape_rewards`, which gives padding exactly 0). ``selective_log_softmax(logits,
index)`` and ``logprobs_from_logits(logits, labels, gather=True)`` return log-probs in the logits' dtype,
computed by :func:`~kltutorial.logprobs.get_logprobs_for_tokens`. See :mod:`kltutorial.compat` for what
differs on purpose.

Every function returns the dtype TRL's returns (``selective_log_softmax`` as in v1.9.0 and main f2cd57710;
``logprobs_from_logits``, ``_kl_penalty`` and ``compute_rewards`` as in v0.11.4, read in their source):
the log-probs the logits' dtype, float64 included; the KL penalty and the three tensors of
``compute_rewards`` the promoted dtype of ``logprob`` and ``ref_logprob`` (float64 stays float64; float32
with float64 gives float64). The work is done in float32, or in float64 where an input is float64, and
rounded once to that dtype.

Examples
--------
>>> from kltutorial.compat import trl
>>> ctl = trl.AdaptiveKLController(init_kl_coef=0.2, target=6, horizon=10000)
>>> ctl.update(current=9.0, n_steps=256)  # returns None, as TRL's does
>>> round(ctl.value, 8)  # 0.2 * (1 + 0.2 * 256 / 10000)
0.201024
"""

from __future__ import annotations

import torch

from ._controllers import PeerAdaptiveKLController, PeerFixedKLController
from ._functional import full_log_softmax, token_logprobs
from ._kl import full_penalty, rewards_with_penalty, sampled_penalty

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "kl_penalty",
    "compute_rewards",
    "selective_log_softmax",
    "logprobs_from_logits",
]


class AdaptiveKLController(PeerAdaptiveKLController):
    """TRL's ``AdaptiveKLController(init_kl_coef, target, horizon)``; ``update(current, n_steps)``."""


class FixedKLController(PeerFixedKLController):
    """TRL's ``FixedKLController(kl_coef)``; ``update(current, n_steps)`` changes nothing."""


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """TRL's ``PPOTrainer._kl_penalty``: ``kl`` (k1), ``abs``, ``mse`` (k2) per token, or ``full``, the exact
    KL(pi || pi_ref) at each position of full log-softmax tensors (..., V); other names raise
    ``NotImplementedError``, as TRL's does. The result has TRL's dtype, that of ``logprob - ref_logprob``
    (``F.kl_div``'s for ``full``): float64 stays float64, half precision is computed in float32 and rounded
    once to it.

    Examples
    --------
    >>> kl_penalty(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0]), "mse")
    tensor([0.1250, 0.5000])
    """
    if kl_penalty == "full":
        return full_penalty(logprob, ref_logprob)
    return sampled_penalty(logprob, ref_logprob, kl_penalty, allowed=("kl", "abs", "mse"),
                           library="TRL's PPOTrainer")


def compute_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, masks: torch.Tensor,
    kl_coef: float, kl_penalty: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's ``PPOTrainer.compute_rewards`` as a function (its ``kl_ctl.value`` is ``kl_coef``): per-token KL
    estimates ``kls`` (B, T), ``non_score_rewards = -kl_coef * kls``, and ``rewards``, the same plus each
    score at its sequence's last position whose mask is 1. All three in the dtype of ``kls``, as TRL's (the
    score is added in that dtype).

    Examples
    --------
    >>> rewards, non_score, kls = compute_rewards(
    ...     torch.tensor([1.0]), torch.tensor([[-1.0, -1.0, -2.0]]), torch.tensor([[-1.5, -1.0, -1.0]]),
    ...     torch.tensor([[1, 1, 0]]), kl_coef=0.1)
    >>> rewards  # the padded position keeps -0.1 * kl, as TRL's does
    tensor([[-0.0500,  1.0000,  0.1000]])
    """
    kls = _penalty(logprobs, ref_logprobs, kl_penalty)
    rewards, non_score = rewards_with_penalty(scores, kls, masks, kl_coef)
    return rewards, non_score, kls


_penalty = kl_penalty  # compute_rewards' own argument is called kl_penalty, as TRL's


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """TRL's ``selective_log_softmax``: ``log_softmax(logits, -1)`` gathered at ``index``, without the full
    log-softmax. The naive equivalent::

        # for index with shape (...):
        torch.gather(logits.log_softmax(-1), dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
        # for index with shape (..., K):
        torch.gather(logits.log_softmax(-1), dim=-1, index=index)

    Parameters
    ----------
    logits : Tensor, shape (..., V)
    index : Tensor, shape (...) or (..., K), integer

    Returns
    -------
    Tensor, the shape of ``index``, the logits' dtype
        As TRL's (main f2cd57710): float64 logits give float64 log-probs, computed in float64.

    Notes
    -----
    Computed by :func:`~kltutorial.logprobs.get_logprobs_for_tokens`, one chunk of positions at a time.
    Where it differs from TRL's on purpose: float16/bfloat16 log-probs are computed in float32 and rounded
    once to the logits' dtype (TRL's ``log_softmax`` one sequence at a time in the logits' dtype, which
    rounds ``x - max`` first: within 1 ulp, not bit-equal); NaN, ``+inf`` and all ``-inf`` positions raise
    ``ValueError``, and so do an ``index`` of another shape or out of ``[0, V)`` (TRL's ``gather`` raises
    ``RuntimeError``).

    Examples
    --------
    >>> logits = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    >>> selective_log_softmax(logits, torch.tensor([1, 0]))  # log 3/4, log 1/2
    tensor([-0.2877, -0.6931])
    >>> selective_log_softmax(logits.half(), torch.tensor([[1, 0], [0, 0]]))  # K = 2 ids, float16 back
    tensor([[-0.2876, -1.3867],
            [-0.6934, -0.6934]], dtype=torch.float16)
    """
    return token_logprobs(logits, index, labels_name="index", k_ids=True)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, gather: bool = True) -> torch.Tensor:
    """TRL's ``logprobs_from_logits`` (``trl/core.py``, up to v0.11): the log-probs of ``labels`` (B, T) under
    (B, T, V) logits, or with ``gather=False`` the whole ``log_softmax(logits, dim=2)``, (B, T, V), with
    ``labels`` unused, as TRL's.

    Both in the logits' dtype: half precision computed in float32 and rounded once (TRL's in the logits'
    dtype). ``gather=True`` runs :func:`~kltutorial.logprobs.get_logprobs_for_tokens`, without TRL's
    (B, T, V) log-softmax; ``gather=False`` returns that tensor, so it makes it. NaN, ``+inf`` and all
    ``-inf`` positions raise ``ValueError`` (TRL's carries NaN on), and so do logits that are not 3-D (TRL's
    normalises dimension 2, the vocabulary only for (B, T, V)).

    Examples
    --------
    >>> logits = torch.log(torch.tensor([[[0.25, 0.75], [0.5, 0.5]]]))
    >>> logprobs_from_logits(logits, torch.tensor([[1, 0]]))
    tensor([[-0.2877, -0.6931]])
    >>> logprobs_from_logits(logits, None, gather=False).exp()
    tensor([[[0.2500, 0.7500],
             [0.5000, 0.5000]]])
    """
    if not isinstance(gather, bool):
        raise TypeError(f"gather must be a bool, got {type(gather).__name__}")
    if not gather:
        return full_log_softmax(logits)
    return token_logprobs(logits, labels, ndim=3)
