"""verl's names over the package's code: the KL controllers and KL penalties of
``verl/trainer/ppo/core_algos.py`` and the log-prob and masked-mean functions of
``verl/utils/torch_functional.py`` (v0.9).

``AdaptiveKLController(init_kl_coef, target_kl, horizon)`` with ``update(current_kl, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value`` and the adaptive one its target
in ``.target``, as verl's do. ``logprobs_from_logits(logits, labels, inplace_backward=True)`` and
``logprobs_from_logits_v2(logits, labels)`` compute the labels' log-probs with
:func:`~kltutorial.logprobs.get_logprobs_for_tokens` (where verl uses flash-attn's cross entropy if it is
installed, else a row loop); ``logprobs_from_logits_naive`` is the textbook ``log_softmax`` then gather,
:func:`~kltutorial.logprobs.naive_logprobs_for_tokens`; ``masked_mean(values, mask, axis=None)`` is verl's.
Logits are (..., V) with labels (...): verl's own calls pass (N, V) with (N,), or (B, T, V) with (B, T).
See :mod:`kltutorial.compat` for what differs on purpose.

Every function returns the dtype verl's returns (v0.9 and main 1dda039b9, read in their source): the
log-prob functions the logits' dtype, float64 included (``logprobs_from_logits`` as verl's path without
flash-attn, whose flash-attn path returns float32); ``kl_penalty`` and ``kl_penalty_forward`` the promoted
dtype of ``logprob`` and ``ref_logprob``; ``masked_mean`` the dtype of verl's ``sum(values * mask) /
(sum(mask) + 1e-8)``, which is float32 for float16 or bfloat16 values under a boolean or integer mask of
their shape (the ``+ 1e-8`` makes a float32 denominator). Except in ``logprobs_from_logits_naive``, which
is verl's own arithmetic, the work is done in float32, or in float64 where an input is float64, and rounded
once to that dtype.

Examples
--------
>>> from kltutorial.compat import verl
>>> ctl = verl.AdaptiveKLController(init_kl_coef=0.001, target_kl=0.1, horizon=10000)
>>> ctl.update(current_kl=0.05, n_steps=1024)
>>> round(ctl.value, 10), ctl.target  # 0.001 * (1 - 0.2 * 1024 / 10000)
(0.00097952, 0.1)
"""

from __future__ import annotations

import torch

from .._validation import check_logits, check_token_ids
from ..logprobs import naive_logprobs_for_tokens
from ._controllers import PeerAdaptiveKLController, PeerFixedKLController
from ._functional import masked_mean as _masked_mean
from ._functional import token_logprobs
from ._kl import sampled_penalty

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "kl_penalty",
    "kl_penalty_forward",
    "logprobs_from_logits",
    "logprobs_from_logits_naive",
    "logprobs_from_logits_v2",
    "masked_mean",
]

_FORWARD = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


class AdaptiveKLController(PeerAdaptiveKLController):
    """verl's ``AdaptiveKLController(init_kl_coef, target_kl, horizon)``; ``update(current_kl, n_steps)``."""

    _target_name, _kl_name = "target_kl", "current_kl"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        super().__init__(init_kl_coef, target_kl, horizon)

    def __repr__(self) -> str:
        return (f"AdaptiveKLController(init_kl_coef={self._betas[0]!r}, target_kl={self.target_kl!r}, "
                f"horizon={self.horizon!r})")

    def update(self, current_kl: float, n_steps: int) -> None:  # type: ignore[override]
        """Observe the KL measured with ``.value`` over ``n_steps`` samples; ``.value`` moves."""
        super().update(current_kl, n_steps)


class FixedKLController(PeerFixedKLController):
    """verl's ``FixedKLController(kl_coef)``; ``update(current_kl, n_steps)`` changes nothing."""

    _kl_name = "current_kl"

    def update(self, current_kl: float, n_steps: int) -> None:  # type: ignore[override]
        """Record the KL; the coefficient does not change."""
        super().update(current_kl, n_steps)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl's ``kl_penalty``: the estimate named by ``kl_penalty``, any of ``kl``/``k1``, ``abs``,
    ``mse``/``k2``, ``low_var_kl``/``k3``, each also with a ``+`` suffix (straight-through: its value, the
    gradient of k2); ``"full"`` and other names raise ``NotImplementedError``, as verl's does.

    The result has verl's dtype, that of ``logprob - ref_logprob`` (float64 stays float64; a float32 and a
    float64 input give float64; half precision is computed in float32 and rounded once to it).

    Examples
    --------
    >>> lp, ref = torch.tensor([-1.0, -30.0]), torch.tensor([-1.5, -0.5])
    >>> kl_penalty(lp, ref, "low_var_kl")  # the second clamped to 10, as verl's
    tensor([ 0.1065, 10.0000])
    """
    names = _FORWARD + tuple(f"{n}+" for n in _FORWARD)
    return sampled_penalty(logprob, ref_logprob, kl_penalty, allowed=names, library="verl's kl_penalty")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl's ``kl_penalty_forward``: the plain names only (no ``+``), with the same clamps and dtype."""
    return sampled_penalty(logprob, ref_logprob, kl_penalty, allowed=_FORWARD,
                           library="verl's kl_penalty_forward")


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True
) -> torch.Tensor:
    """verl's ``logprobs_from_logits``: the log-prob of each label, ``log_softmax(logits, -1)`` gathered at
    ``labels``; logits (..., V), labels (...), the result the shape of ``labels``.

    Computed by :func:`~kltutorial.logprobs.get_logprobs_for_tokens` (chunked, its backward recomputing the
    softmax), in the logits' dtype (float64 computed and returned in float64): verl's path without flash-attn
    (``logprobs_from_logits_v2``, v0.9 and main) returns that dtype, while its flash-attn path returns
    float32 whatever the logits. ``inplace_backward`` is flash-attn's switch
    to write the gradient over the logits; it is accepted and has nothing to switch here (the backward
    allocates only the gradient). Where it differs on purpose: half precision computed in float32 and rounded
    once; NaN, ``+inf`` and all ``-inf`` positions raise ``ValueError``, and so does a label outside ``[0,
    V)`` (flash-attn's gives log-prob 0 for its ``ignore_index`` -100).

    Examples
    --------
    >>> logits = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))  # (N, V)
    >>> logprobs_from_logits(logits, torch.tensor([1, 0]))  # (N,): log 3/4, log 1/2
    tensor([-0.2877, -0.6931])
    """
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"inplace_backward must be a bool, got {type(inplace_backward).__name__}")
    return token_logprobs(logits, labels)


def logprobs_from_logits_v2(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """verl's ``logprobs_from_logits_v2`` (its memory-saving row loop), here the same computation as
    :func:`logprobs_from_logits`: the labels' log-probs in the logits' dtype, as verl's (v0.9 and main),
    float64 computed in float64, half precision computed in float32 and rounded once (verl's runs
    ``log_softmax`` per row in the logits' dtype).

    Examples
    --------
    >>> logprobs_from_logits_v2(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))[0]  # log 1/4
    tensor([-1.3863, -1.3863, -1.3863])
    """
    return token_logprobs(logits, labels)


def logprobs_from_logits_naive(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """verl's ``logprobs_from_logits_naive``: ``log_softmax(logits, -1)`` then gather, in the logits' dtype
    (float64 stays float64), as verl writes it in v0.4 to v0.9 and main 1dda039b9
    (:func:`~kltutorial.logprobs.naive_logprobs_for_tokens`: the full (..., V) log-softmax is made, and half
    precision is computed by PyTorch's kernel in that precision, as verl's, bit for bit). The baseline that
    verl's tests compare the other two with. Labels are checked (shape, range); the logits are not scanned
    for NaN. (verl's unmerged pull request #3852 would make it ``-cross_entropy(logits.float())``, float32
    for every dtype; released verl does not.)

    Examples
    --------
    >>> logprobs_from_logits_naive(torch.log(torch.tensor([[0.25, 0.75]])), torch.tensor([1]))
    tensor([-0.2877])
    """
    check_logits(logits, "logits", ndim=None)
    check_token_ids(labels, "labels", logits.shape[:-1], logits.shape[-1])
    return naive_logprobs_for_tokens(logits, labels)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """verl's ``masked_mean``: ``sum(values * mask, axis) / (sum(mask, axis) + 1e-8)``, so an all-zero mask
    gives 0. ``mask`` broadcasts to ``values`` as verl's does; entries where it is 0 never count, NaN there
    included, as verl's ``masked_sum`` replaces them. Where it differs on purpose: NaN where the mask is not 0
    raises ``ValueError`` (verl's returns NaN); a negative or non-finite mask raises; half-precision values
    are summed in float32 and the quotient rounded once to verl's dtype.

    The result has verl's dtype (v0.9 and main), that of ``(values * mask).sum(axis) / (mask.sum(axis) +
    1e-8)`` by PyTorch's promotion. Under a boolean or integer mask of the values' shape it is float64 for
    float64 values and float32 for float32, float16 and bfloat16 values (the ``+ 1e-8`` makes the
    denominator float32); a floating-point mask promotes with the values (float16 values under a float16
    mask give float16); where the mask's sum is 0-dim and the numerator's is not, the numerator's dtype is
    kept. float64 is computed in float64.

    Examples
    --------
    >>> masked_mean(torch.tensor([1.0, 2.0, float("nan"), 4.0]), torch.tensor([1, 0, 0, 1]))
    tensor(2.5000)
    >>> masked_mean(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [0, 0]]), axis=-1)
    tensor([2., 0.])
    """
    return _masked_mean(values, mask, axis, eps=1e-8, values_name="values", mask_name="mask", dim_name="axis")
