"""Hand-made per-token KL patterns of the source handbook's section 10 (book section 10).

**Illustrations, not measurements**: three curves drawn to show where in a response KL might
concentrate (a reformulated opening, a novel conclusion, spikes at specific word choices). The
measured per-token KL of a real policy is in :func:`kltutorial.sequences.per_position_kl`, and the
book shows the two side by side.
"""

from __future__ import annotations

import numpy as np

from ._validation import check_coef, check_positive_int, check_rng

__all__ = ["illustrative_token_kl_patterns"]


def illustrative_token_kl_patterns(
    seq_len: int = 50, rng: np.random.Generator | None = None, noise: float = 0.15
) -> dict[str, np.ndarray]:
    """Three hand-made per-token KL curves (handbook §10). **Illustrations, not measurements.**

    * ``"reformulated opening"``: ``2 exp(−3 i/(T−1)) + 0.1``, high KL at the first tokens;
    * ``"novel conclusion"``: ``1.5 exp(3 (i/(T−1) − 1)) + 0.1``, high KL at the last tokens;
    * ``"specific word choices"``: 0.2 everywhere, with spikes of height U(1.5, 3) at the
      relative positions 0.1, 0.24, 0.46, 0.7, 0.9 of the sequence.

    Each curve is multiplied by ``exp(noise · ε_i)`` with ε standard normal, so it wiggles but
    stays positive (an exact per-token KL cannot be negative; the handbook's additive noise
    could make it so).

    Parameters
    ----------
    seq_len : int
        T >= 10, number of token positions.
    rng : numpy.random.Generator
        Source of the spike heights and wiggles (required).
    noise : float
        Log-scale size of the wiggles (>= 0).

    Returns
    -------
    dict name -> ndarray, shape (T,)
        KL at each position (nats), every value > 0.
    """
    seq_len = check_positive_int(seq_len, "seq_len")
    if seq_len < 10:
        raise ValueError(f"seq_len: expected at least 10 positions, got {seq_len}")
    rng = check_rng(rng)
    noise = check_coef(noise, "noise")
    u = np.linspace(0.0, 1.0, seq_len)  # relative position in the sequence
    opening = 2.0 * np.exp(-3.0 * u) + 0.1
    conclusion = 1.5 * np.exp(3.0 * (u - 1.0)) + 0.1
    spiky = np.full(seq_len, 0.2)
    spikes = np.round(np.array([0.1, 0.24, 0.46, 0.7, 0.9]) * (seq_len - 1)).astype(int)
    spiky[spikes] = rng.uniform(1.5, 3.0, size=spikes.size)
    wiggle = np.exp(noise * rng.standard_normal((3, seq_len)))
    return {
        "reformulated opening": opening * wiggle[0],
        "novel conclusion": conclusion * wiggle[1],
        "specific word choices": spiky * wiggle[2],
    }
