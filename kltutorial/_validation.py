"""Input checks shared by every public function of the package.

Each public function checks its input once, with the checks below, and then calls private helpers that
trust their caller. Each check raises ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind,
wrong value) with a message that names the argument and says what was expected, so that a wrong call
fails at the boundary instead of returning a silently wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np
import torch

__all__ = [
    "as_real",
    "check_betas",
    "check_logprobs",
    "check_table",
    "check_values",
    "normalisation_tolerance",
    "check_positions_mask",
    "check_float_tensor",
    "check_logits",
    "check_tensor_pair",
    "check_token_ids",
    "check_token_index",
    "check_mask",
    "check_same_shape",
    "check_scores",
    "check_real",
    "check_coef",
    "check_positive",
    "check_greater",
    "check_positive_int",
    "check_nonnegative_int",
    "check_seed",
    "check_choice",
    "check_rng",
    "check_generator",
]


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


# ----------------------------------------------------------------------------------------------------
# Tensors


def _check_float_kind(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def check_float_tensor(
    x: object,
    name: str,
    ndim: int | Sequence[int] | None = None,
    allow_inf: bool = False,
) -> torch.Tensor:
    """Check a non-empty floating-point tensor of the given rank with no NaN (and no inf unless allowed).

    ``-inf`` is allowed with ``allow_inf`` (logits of tokens masked out of the vocabulary); ``+inf`` never.
    This scans the whole tensor; for logits, :func:`check_logits` checks only the cheap properties.
    """
    _check_float_kind(x, name)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {_shape(x)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {_shape(x)}")
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    if allow_inf:
        if torch.isposinf(x).any():
            raise ValueError(f"{name} contains +inf; only -inf (an impossible token) is allowed")
    elif torch.isinf(x).any():
        raise ValueError(f"{name} contains inf; expected finite values")
    return x


def check_logits(x: object, name: str, ndim: int | None = 3) -> torch.Tensor:
    """Check a non-empty floating-point tensor of logits, (B, T, V) by default, without reading its values.

    Scanning logits for NaN reads them once more and allocates a (B, T, V) boolean mask; the lean
    kernels of :mod:`kltutorial.logprobs` find NaN, ``+inf`` and all ``-inf`` rows in the rows they
    normalise anyway, so only the shape and dtype are checked here. ``ndim=None`` accepts any leading
    shape, (..., V), with at least the vocabulary dimension.
    """
    _check_float_kind(x, name)
    if ndim is None:
        if x.dim() < 1:
            raise ValueError(f"{name} must have at least 1 dimension (..., V), got a 0-d tensor")
    elif x.dim() != ndim:
        want = "(B, T, V)" if ndim == 3 else f"(..., V) of rank {ndim}"
        raise ValueError(f"{name} must have {ndim} dimensions {want}, got shape {_shape(x)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {_shape(x)}")
    return x


def check_same_shape(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    """Check that two tensors have the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{a_name} and {b_name} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_tensor_pair(a: object, a_name: str, b: object, b_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Check two finite, non-empty floating-point tensors of the same shape (e.g. two models' log-probs)."""
    check_float_tensor(a, a_name)
    check_float_tensor(b, b_name)
    check_same_shape(a, a_name, b, b_name)
    return a, b


def check_token_ids(
    tokens: object, name: str, shape: torch.Size, vocab_size: int | None,
    shape_of: str = "the logits' leading dimensions",
) -> torch.Tensor:
    """Check integer token ids of the given shape (``shape_of`` says whose), each in ``[0, vocab_size)``
    (not checked if ``vocab_size`` is None)."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long), got dtype {tokens.dtype}")
    if tokens.shape != shape:
        raise ValueError(
            f"{name} must have shape {tuple(shape)} to match {shape_of}, got {tuple(tokens.shape)}"
        )
    if tokens.numel() and vocab_size is not None:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"{name} must lie in [0, {vocab_size}) (the vocabulary size), got values in [{lo}, {hi}]"
            )
    return tokens


def check_token_index(tokens: object, name: str, logits_shape: torch.Size) -> tuple[torch.Tensor, bool]:
    """Check token ids for logits of shape (..., V): one id per position, or K >= 1 ids per position.

    ``tokens`` of shape (...) (the logits' leading shape) holds one id per position; of shape (..., K),
    K ids per position (TRL's ``selective_log_softmax`` takes both). Returns the ids as (..., K), K = 1
    for the first form, and whether they were one per position.
    """
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    lead, vocab = logits_shape[:-1], logits_shape[-1]
    single = tokens.shape == lead
    if not single and not (tokens.dim() == len(lead) + 1 and tokens.shape[:-1] == lead
                           and tokens.shape[-1] >= 1):
        one, k = tuple(lead), "(" + "".join(f"{s}, " for s in lead) + "K)"
        raise ValueError(
            f"{name} must have shape {one} (one id per position) or {k} with K >= 1 (K ids per "
            f"position), to match the logits' leading dimensions, got {tuple(tokens.shape)}"
        )
    check_token_ids(tokens, name, tokens.shape, vocab)
    return (tokens.unsqueeze(-1) if single else tokens), single


def check_mask(mask: object, name: str, shape: torch.Size) -> torch.Tensor:
    """Check a 0/1 attention mask of the given shape; return it as a boolean tensor."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of 0/1 values, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype.is_complex:
        raise TypeError(f"{name} must be boolean, integer or float 0/1, got dtype {mask.dtype}")
    if mask.numel() and not ((mask == 0) | (mask == 1)).all():
        raise ValueError(f"{name} must contain only 0 and 1 (1 = valid token, 0 = padding)")
    return mask.bool()


def check_scores(scores: object, name: str, batch: int) -> torch.Tensor:
    """Check one finite floating-point score per sequence: shape ``(batch,)``."""
    check_float_tensor(scores, name, ndim=1)
    if scores.shape[0] != batch:
        raise ValueError(
            f"{name} must have shape ({batch},), one score per sequence, got {tuple(scores.shape)}"
        )
    return scores


# ----------------------------------------------------------------------------------------------------
# Numbers


def as_real(x: object, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def check_real(x: object, name: str) -> float:
    """Check a finite real number; a 0-d tensor or array (e.g. ``kl.mean()``) is accepted and unwrapped."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        if x.ndim != 0:
            raise ValueError(f"{name} must be a single number, got an array of shape {tuple(x.shape)}")
        x = x.item()  # a bool or complex element is then rejected like a bool or complex number
    v = as_real(x, name)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}")
    return v


def check_coef(x: object, name: str) -> float:
    """Check a finite, non-negative coefficient such as beta; return it as float."""
    v = as_real(x, name)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    return v


def check_positive(x: object, name: str) -> float:
    """Check a finite, strictly positive number; return it as float."""
    return check_greater(x, name, 0.0)


def check_greater(x: object, name: str, bound: float) -> float:
    """Check a finite number strictly greater than ``bound``; return it as float."""
    v = as_real(x, name)
    if not math.isfinite(v) or v <= bound:
        raise ValueError(f"{name} must be a finite number > {bound:g}, got {v}")
    return v


def _as_int(x: object, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    return int(x)


def check_positive_int(x: object, name: str) -> int:
    """Check a strictly positive integer."""
    v = _as_int(x, name)
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")
    return v


def check_nonnegative_int(x: object, name: str) -> int:
    """Check an integer >= 0 (a count that may be zero)."""
    v = _as_int(x, name)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    return v


def check_seed(seed: object, name: str = "seed") -> int:
    """Check a seed for ``np.random.default_rng`` or ``torch.Generator().manual_seed``: an int >= 0."""
    return check_nonnegative_int(seed, name)


# ----------------------------------------------------------------------------------------------------
# Choices, generators, spellings


def check_choice(x: object, name: str, choices: Collection[str]) -> str:
    """Check that ``x`` is one of ``choices``."""
    if not isinstance(x, str) or x not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {x!r}")
    return x


def check_rng(rng: object, name: str = "rng") -> np.random.Generator:
    """Check a NumPy random generator (pass ``np.random.default_rng(seed)``)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (e.g. np.random.default_rng(0)), "
            f"got {type(rng).__name__}"
        )
    return rng


def check_generator(generator: object, name: str = "generator") -> torch.Generator:
    """Check a torch random generator (pass ``torch.Generator().manual_seed(seed)``)."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{name} must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
            f"got {type(generator).__name__}"
        )
    return generator


def check_positions_mask(mask: object, shape: tuple[int, ...]) -> torch.Tensor:
    """A (B, T) or (T,) 0/1 mask, as a boolean tensor broadcastable to ``shape``; None: every position."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    if isinstance(mask, torch.Tensor) and mask.dim() == 1:
        return check_mask(mask, "mask", torch.Size(shape[-1:])).expand(shape)
    return check_mask(mask, "mask", torch.Size(shape))


# ----------------------------------------------------------------------------------------------------
# Distributions over a listed space (kltutorial.exact) and β grids


def normalisation_tolerance(x: torch.Tensor) -> float:
    """How far from 0 a log-normaliser may be: sqrt(eps), 1.5e-8 in float64, 3.5e-4 in float32."""
    return math.sqrt(torch.finfo(x.dtype).eps)


def check_table(space: object, table: object, name: str) -> torch.Tensor:
    """A next-token table of ``space`` (a :class:`~kltutorial.exact.SequenceSpace`): shape
    (n_prefixes, V), every row normalised."""
    table = check_float_tensor(table, name, ndim=2, allow_inf=True)
    want = (space.n_prefixes, space.vocab_size)
    if tuple(table.shape) != want:
        raise ValueError(
            f"{name} must have shape {want}, one row of next-token log-probs per prefix of length "
            f"0 to {space.length - 1}; got {tuple(table.shape)}"
        )
    off = torch.logsumexp(table, dim=-1).abs().max()
    if not off <= normalisation_tolerance(table):
        raise ValueError(
            f"{name} must hold next-token log-probabilities (every row's logsumexp 0), but a row is off "
            f"by {float(off):.3g}; for logits pass torch.log_softmax(logits, dim=-1)"
        )
    return table


def check_logprobs(x: object, name: str, size: int | None = None) -> torch.Tensor:
    """The log-probabilities of one distribution over ``size`` outcomes (1-D, logsumexp 0)."""
    x = check_float_tensor(x, name, ndim=1, allow_inf=True)
    if size is not None and x.shape[0] != size:
        raise ValueError(f"{name} must have shape ({size},), one log-prob per sequence; got {tuple(x.shape)}")
    off = torch.logsumexp(x, dim=0).abs()
    if not off <= normalisation_tolerance(x):
        raise ValueError(
            f"{name} must be the log-probabilities of a distribution (logsumexp 0), but its logsumexp is "
            f"off by {float(off):.3g}; normalise it with {name} - torch.logsumexp({name}, 0)"
        )
    return x


def check_values(x: object, name: str, size: int) -> torch.Tensor:
    """One finite value per outcome, 1-D of length ``size``."""
    x = check_float_tensor(x, name, ndim=1)
    if x.shape[0] != size:
        raise ValueError(f"{name} must have shape ({size},), one value per sequence; got {tuple(x.shape)}")
    return x


def check_betas(betas: object) -> np.ndarray:
    """A non-empty 1-D array of finite β values > 0."""
    try:
        arr = np.asarray(betas, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"betas must be a sequence of numbers, got {type(betas).__name__}") from None
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"betas must be a non-empty sequence of finite numbers > 0, got {betas!r}")
    return arr
