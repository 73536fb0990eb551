"""Input checks shared by every public function of the package.

Each check raises ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind, wrong value) with a
message that names the argument and says what was expected, so that a wrong call fails at the boundary
instead of returning a silently wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "check_float_tensor",
    "check_token_ids",
    "check_mask",
    "check_same_shape",
    "check_coef",
    "check_positive",
    "check_positive_int",
    "check_choice",
    "check_rng",
    "check_generator",
]


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def check_float_tensor(
    x: object,
    name: str,
    ndim: int | Sequence[int] | None = None,
    allow_inf: bool = False,
    allow_empty: bool = False,
) -> torch.Tensor:
    """Check that ``x`` is a floating-point tensor of the given rank with no NaN (and no inf unless allowed).

    ``-inf`` is allowed with ``allow_inf`` (logits of tokens masked out of the vocabulary); ``+inf`` never.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {_shape(x)}")
    if not allow_empty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {_shape(x)}")
    if x.numel():
        if torch.isnan(x).any():
            raise ValueError(f"{name} contains NaN")
        if allow_inf:
            if torch.isposinf(x).any():
                raise ValueError(f"{name} contains +inf; only -inf (an impossible token) is allowed")
        elif torch.isinf(x).any():
            raise ValueError(f"{name} contains inf; expected finite values")
    return x


def check_token_ids(tokens: object, name: str, shape: torch.Size, vocab_size: int) -> torch.Tensor:
    """Check integer token ids of the given shape, each in ``[0, vocab_size)``."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long), got dtype {tokens.dtype}")
    if tokens.shape != shape:
        raise ValueError(
            f"{name} must have shape {tuple(shape)} to match the logits' leading dimensions, "
            f"got {tuple(tokens.shape)}"
        )
    if tokens.numel():
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"{name} must lie in [0, {vocab_size}) (the vocabulary size), got values in [{lo}, {hi}]"
            )
    return tokens


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


def check_same_shape(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    """Check that two tensors have the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{a_name} and {b_name} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _as_real(x: object, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def check_coef(x: object, name: str) -> float:
    """Check a finite, non-negative coefficient such as beta; return it as float."""
    v = _as_real(x, name)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    return v


def check_positive(x: object, name: str) -> float:
    """Check a finite, strictly positive number; return it as float."""
    v = _as_real(x, name)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {v}")
    return v


def check_positive_int(x: object, name: str) -> int:
    """Check a strictly positive integer."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < 1:
        raise ValueError(f"{name} must be >= 1, got {x}")
    return int(x)


def check_choice(x: object, name: str, choices: Sequence[str]) -> str:
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
