"""The peers' log-prob and masked-mean utilities over the package's code (shared by ``compat.trl``,
``compat.verl`` and ``compat.openrlhf``): their dtypes and reductions, the package's kernel and checks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._validation import check_float_tensor, check_logits, check_token_ids, check_token_index
from ..logprobs import get_logprobs_for_tokens

__all__ = ["token_logprobs", "full_log_softmax", "masked_mean"]

_HALF = (torch.float16, torch.bfloat16)


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, *, labels_name: str = "labels", k_ids: bool = False,
    ndim: int | None = None, temperature: float = 1.0,
) -> torch.Tensor:
    """:func:`~kltutorial.logprobs.get_logprobs_for_tokens` in the logits' dtype, as the peers return it
    (half precision is computed in float32 and rounded once). ``labels`` is one id per position, or, with
    ``k_ids``, K ids per position; errors name it ``labels_name``. ``ndim`` fixes the logits' rank."""
    check_logits(logits, "logits", ndim=ndim)
    if k_ids:
        check_token_index(labels, labels_name, logits.shape)
    else:
        check_token_ids(labels, labels_name, logits.shape[:-1], logits.shape[-1])
    return get_logprobs_for_tokens(logits, labels, temperature=temperature).to(logits.dtype)


def full_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits, -1)`` of (B, T, V) logits in their dtype (computed in float32 for half
    precision); NaN, ``+inf`` and a position whose logits are all ``-inf`` raise ``ValueError``."""
    check_float_tensor(logits, "logits", ndim=3, allow_inf=True)
    dtype = torch.float32 if logits.dtype in _HALF else None
    logp = F.log_softmax(logits, dim=-1, dtype=dtype).to(logits.dtype)  # (B, T, V)
    bad = torch.isnan(logp[..., 0])  # only a row of -inf logits is NaN once NaN and +inf are excluded
    if bool(bad.any()):
        b, t = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(
            f"logits is -inf for every token at position (b={b}, t={t}); at least one token must be possible"
        )
    return logp


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor | None, dim: int | tuple[int, ...] | None, *, eps: float | None,
    values_name: str, mask_name: str, dim_name: str,
) -> torch.Tensor:
    """``sum(values * mask, dim) / (sum(mask, dim) + eps)``, the peers' masked mean, with ``mask``
    broadcast to ``values`` as theirs is.

    Entries where the mask is 0 never count, whatever their value (so NaN there is ignored, as verl's
    ``masked_sum`` does); NaN where it is not 0 raises. ``eps=None`` is OpenRLHF's form, without the
    epsilon, where an all-zero mask along ``dim`` raises (theirs gives NaN); with verl's ``eps=1e-8`` it
    gives 0. The numerator is summed in float32 for half precision (float64 stays float64), the denominator
    is theirs, and the quotient is rounded once to the dtype of their expression, dimensions included
    (:func:`_quotient_dtype`). ``mask=None`` keeps every entry.
    """
    if not isinstance(values, torch.Tensor) or not torch.is_floating_point(values):
        kind = values.dtype if isinstance(values, torch.Tensor) else type(values).__name__
        raise TypeError(f"{values_name} must be a floating-point torch.Tensor, got {kind}")
    if mask is None:  # OpenRLHF's tensor.mean(dim)
        mask = torch.ones((), dtype=torch.bool, device=values.device).expand(values.shape)
    if not isinstance(mask, torch.Tensor) or mask.dtype.is_complex:
        kind = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{mask_name} must be a boolean, integer or float torch.Tensor, got {kind}")
    try:
        shape = torch.broadcast_shapes(values.shape, mask.shape)
    except RuntimeError:
        shape = None
    if shape != values.shape:
        raise ValueError(
            f"{mask_name} must broadcast to {values_name}'s shape {tuple(values.shape)}, "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool and mask.numel() and not bool(((mask >= 0) & (mask < torch.inf)).all()):
        raise ValueError(f"{mask_name} must be finite and >= 0 (1 = keep, 0 = leave out)")
    if isinstance(dim, bool) or not (dim is None or isinstance(dim, (int, tuple))):
        raise TypeError(f"{dim_name} must be an int, a tuple of ints or None, got {type(dim).__name__}")
    work = torch.float64 if torch.float64 in (values.dtype, mask.dtype) else torch.float32
    weighted = torch.where(mask.bool(), values.to(work), 0.0) * mask.to(work)  # the shape of values
    if bool(torch.isnan(weighted).any()):
        raise ValueError(f"{values_name} contains NaN where {mask_name} is not 0")
    count = mask.sum(dim=dim)  # as theirs: int64 for a boolean or integer mask
    if eps is None:
        if bool((count == 0).any()):
            raise ValueError(
                f"{mask_name} is 0 everywhere along {dim_name}={dim}: the mean of nothing is undefined "
                "(OpenRLHF's masked_mean gives NaN there)"
            )
        denominator = count
    else:
        denominator = count + eps
    total = weighted.sum(dim=dim)  # float32 (float64 if either input is float64)
    return (total / denominator).to(_quotient_dtype(values, mask, total.ndim, denominator))


def _quotient_dtype(
    values: torch.Tensor, mask: torch.Tensor, ndim: int, denominator: torch.Tensor
) -> torch.dtype:
    """The dtype of the peers' ``(values * mask).sum(dim) / denominator``, whose sum has ``ndim`` dimensions.

    PyTorch's promotion, dimensions included: a 0-dim operand does not widen a dimensioned one of the same
    category, so bfloat16 values over a (T,) mask reduced along its only axis (a 0-dim float32
    ``mask.sum() + 1e-8``) stay bfloat16 in verl's, where a (B, T) mask gives float32.
    """
    product = torch.result_type(values, mask)  # values * mask (a 0-dim mask does not widen the values)
    numerator = torch.empty((1,) * min(ndim, 1), dtype=product, device="meta")  # its sum's rank, no data
    return torch.result_type(numerator, denominator)
