r"""What a value of β means: reward scale, KL conventions, and sweeps of β (book section 6).

β is in reward units per nat: the penalised objective :math:`\mathbb{E}_\pi[r] - \beta\,
\mathrm{KL}(\pi\|\pi_\mathrm{ref})` and its optimum :math:`\pi^*_\beta \propto \pi_\mathrm{ref}\,
e^{r/\beta}` depend on r and β only through :math:`r/\beta`. So a β is meaningless without the scale of
the reward it multiplies, and a KL target is meaningless without the reduction that produced the KL the
controller sees:

1. :func:`reward_scale_gap` measures :math:`\max_y |\log\pi^*_{c\beta}[c\,r](y) - \log\pi^*_\beta[r](y)|`
   (zero up to rounding); :func:`normalise_reward` standardises a reward to mean 0 and variance 1
   under :math:`\pi_\mathrm{ref}`, as lm-human-preferences does with its reward model ("so the KL
   coefficient always has the same meaning", ``train_reward.py``);
2. :func:`sum_to_token_mean` and :func:`token_mean_to_sum` convert a KL (or a KL target) between the
   per-sequence sum that TRL and lm-human-preferences feed their controller and the token mean over
   the response mask that verl feeds its own;
3. :func:`max_kl` is the largest KL any :math:`\pi^*_\beta` reaches (β → 0), beyond which a target
   cannot be met; :func:`summarize_sweep` finds where the gold reward of a β sweep peaks and the β
   window in which the optimised policy beats :math:`\pi_\mathrm{ref}` on gold.

Shapes: V**T sequences, K values of β, B sequences in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_betas, check_logprobs, check_positive, check_values
from ..exact.optimum import optimal_policy_unchecked

__all__ = [
    "reward_scale_gap",
    "normalise_reward",
    "sum_to_token_mean",
    "token_mean_to_sum",
    "max_kl",
    "SweepSummary",
    "summarize_sweep",
]


# ----------------------------------------------------------------------------------------------------
# Reward scale


def reward_scale_gap(ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float, scale: float) -> float:
    """:math:`\\max_y |\\log\\pi^*_{c\\beta}[c\\,r](y) - \\log\\pi^*_\\beta[r](y)|` for :math:`c` = ``scale``.

    :math:`\\pi^*_\\beta[r] \\propto \\pi_\\mathrm{ref}\\,e^{r/\\beta}` depends on :math:`r/\\beta` only, and
    :math:`(c\\,r)/(c\\,\\beta) = r/\\beta`: multiplying the reward by :math:`c` is the same as dividing β
    by :math:`c`. The gap is therefore 0 up to floating-point rounding.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
    beta : float
        > 0, reward units per nat.
    scale : float
        :math:`c` > 0.

    Returns
    -------
    float

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> reward_scale_gap(ref, torch.tensor([0.0, 1.0], dtype=torch.float64), beta=0.5, scale=4.0) < 1e-15
    True
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    reward = check_values(reward, "reward", ref_logprobs.shape[0])
    beta = check_positive(beta, "beta")
    scale = check_positive(scale, "scale")
    base = optimal_policy_unchecked(ref_logprobs, reward, beta)
    scaled = optimal_policy_unchecked(ref_logprobs, scale * reward, scale * beta)
    finite = base > -torch.inf
    return float((scaled[finite] - base[finite]).abs().max())


def normalise_reward(ref_logprobs: torch.Tensor, reward: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """Standardise a reward under the reference policy: :math:`\\tilde r = (r - \\mu)/\\sigma` with
    :math:`\\mu = \\mathbb{E}_{\\pi_\\mathrm{ref}}[r]` and
    :math:`\\sigma^2 = \\mathrm{Var}_{\\pi_\\mathrm{ref}}(r)`.

    lm-human-preferences does this to its reward model after training (``normalize_after``: mean 0,
    variance 1 on samples of the reference policy), estimating :math:`\\mu, \\sigma` from samples; here
    they are exact sums. The shift changes no policy (:math:`e^{-\\mu/\\beta}` cancels in
    :math:`\\pi^*_\\beta`); the scale does: :math:`\\pi^*_\\beta[\\tilde r] = \\pi^*_{\\sigma\\beta}[r]`, so
    β on the normalised reward is β·σ on the raw one.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
        The reward must not be constant under :math:`\\pi_\\mathrm{ref}`.

    Returns
    -------
    normalised : Tensor, shape (V**T,)
    mean, std : float
        :math:`\\mu` and :math:`\\sigma`.

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> r, mu, sigma = normalise_reward(ref, torch.tensor([1.0, 3.0], dtype=torch.float64))
    >>> r, mu, sigma
    (tensor([-1.,  1.], dtype=torch.float64), 2.0, 1.0)
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    reward = check_values(reward, "reward", ref_logprobs.shape[0])
    p = ref_logprobs.exp()
    mean = float((p * reward).sum())
    std = float((p * (reward - mean) ** 2).sum().sqrt())
    if not std > 0:
        raise ValueError("reward is constant under pi_ref: it has no scale to normalise (std = 0)")
    return (reward - mean) / std, mean, std


# ----------------------------------------------------------------------------------------------------
# Per-sequence sum and per-token mean


def _check_kl_and_length(kl: object, length: object) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(kl, (bool, str)):
        raise TypeError(f"kl must be a number or an array of numbers (nats), got {type(kl).__name__}")
    try:
        kl_arr = np.asarray(kl, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"kl must be a number or an array of numbers (nats), got {kl!r}") from None
    if not np.all(np.isfinite(kl_arr)):
        raise ValueError(f"kl must be finite (nats), got {kl!r}")
    len_arr = np.asarray(length)
    if len_arr.dtype == bool or not np.issubdtype(len_arr.dtype, np.integer):
        raise TypeError(f"length must be an int or an array of ints (tokens per response), got {length!r}")
    if np.any(len_arr < 1):
        raise ValueError(f"length must be >= 1 (tokens per response), got {length!r}")
    try:
        np.broadcast_shapes(kl_arr.shape, len_arr.shape)
    except ValueError:
        shapes = f"{kl_arr.shape} and {len_arr.shape}"
        raise ValueError(f"kl and length must broadcast, got shapes {shapes}") from None
    return kl_arr, len_arr.astype(float)


def sum_to_token_mean(kl_sum: float | np.ndarray, length: int | np.ndarray) -> float | np.ndarray:
    """A per-sequence KL sum as a per-token mean: :math:`\\bar k = S/T`.

    TRL's old PPO trainer and lm-human-preferences give their controller the batch mean of
    :math:`S_i = \\sum_t \\mathrm{kl}_{i,t}`; verl gives it the batch mean of :math:`S_i/T_i` (the token
    mean over each response's mask). For responses of one length T, a sum target of 6 nats is a
    token-mean target of 6/T.

    Parameters
    ----------
    kl_sum : float or ndarray
        Nats per sequence.
    length : int or ndarray of int
        T, tokens per response (>= 1), broadcast against ``kl_sum``.

    Examples
    --------
    >>> sum_to_token_mean(6.0, 5)
    1.2
    """
    s, t = _check_kl_and_length(kl_sum, length)
    out = s / t
    return float(out) if out.ndim == 0 else out


def token_mean_to_sum(kl_mean: float | np.ndarray, length: int | np.ndarray) -> float | np.ndarray:
    """A per-token mean KL as a per-sequence sum: :math:`S = T\\,\\bar k` (the inverse of
    :func:`sum_to_token_mean`).

    Examples
    --------
    >>> token_mean_to_sum(0.1, 5)  # verl's default target, read as a token mean, on T = 5
    0.5
    """
    m, t = _check_kl_and_length(kl_mean, length)
    out = m * t
    return float(out) if out.ndim == 0 else out


# ----------------------------------------------------------------------------------------------------
# Sweeps of beta


def max_kl(ref_logprobs: torch.Tensor, reward: torch.Tensor) -> float:
    """The supremum of :math:`\\mathrm{KL}(\\pi^*_\\beta\\|\\pi_\\mathrm{ref})` over β > 0, in nats.

    As β → 0, :math:`\\pi^*_\\beta` tends to :math:`\\pi_\\mathrm{ref}` restricted to the maximisers
    :math:`A` of r, whose KL is :math:`-\\log \\pi_\\mathrm{ref}(A)`. No β reaches a larger KL: a KL
    target above it cannot be met, and a controller chasing it drives β towards 0.

    Examples
    --------
    >>> ref = torch.tensor([0.75, 0.25], dtype=torch.float64).log()
    >>> round(max_kl(ref, torch.tensor([0.0, 1.0], dtype=torch.float64)), 4)  # log 4
    1.3863
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    reward = check_values(reward, "reward", ref_logprobs.shape[0])
    support = ref_logprobs > -torch.inf
    top = support & (reward == reward[support].max())
    return -float(torch.logsumexp(ref_logprobs[top], 0))


@dataclass(frozen=True)
class SweepSummary:
    """Where a β sweep of the exact optimum peaks on the gold reward.

    Attributes
    ----------
    betas, kl, proxy, gold : ndarray, shape (K,)
        β (descending), :math:`\\mathrm{KL}(\\pi^*_\\beta\\|\\pi_\\mathrm{ref})` in nats, expected proxy and
        gold reward of :math:`\\pi^*_\\beta`.
    ref_gold : float
        Gold reward of :math:`\\pi_\\mathrm{ref}`.
    peak : int
        Index of the largest gold reward.
    """

    betas: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray
    ref_gold: float
    peak: int

    @property
    def peak_beta(self) -> float:
        """β of the gold peak."""
        return float(self.betas[self.peak])

    @property
    def peak_kl(self) -> float:
        """KL (nats) of the gold peak."""
        return float(self.kl[self.peak])

    @property
    def peak_gold(self) -> float:
        """Gold reward at the peak."""
        return float(self.gold[self.peak])

    @property
    def beats_ref(self) -> np.ndarray:
        """True where :math:`\\pi^*_\\beta` has more gold reward than :math:`\\pi_\\mathrm{ref}`
        (boolean array, shape (K,))."""
        return self.gold > self.ref_gold

    def beta_window(self) -> tuple[float, float]:
        """The smallest and largest β of the grid at which :math:`\\pi^*_\\beta` beats
        :math:`\\pi_\\mathrm{ref}` on gold (NaN, NaN if none does)."""
        b = self.betas[self.beats_ref]
        return (float(b.min()), float(b.max())) if b.size else (float("nan"), float("nan"))


def summarize_sweep(
    betas: np.ndarray, kl: np.ndarray, proxy: np.ndarray, gold: np.ndarray, ref_gold: float
) -> SweepSummary:
    """Sort a sweep by descending β and find its gold peak (e.g. from
    :func:`kltutorial.toyrlhf.exact_frontier`: ``summarize_sweep(f.betas, f.kl, f.proxy, f.gold, g0)``).

    Parameters
    ----------
    betas : array_like, shape (K,)
        Each > 0, distinct.
    kl, proxy, gold : array_like, shape (K,)
        Finite.
    ref_gold : float
        Gold reward of :math:`\\pi_\\mathrm{ref}`.

    Returns
    -------
    SweepSummary

    Examples
    --------
    >>> s = summarize_sweep([1.0, 0.5, 2.0], [1.0, 2.0, 0.5], [1, 2, 0.5], [1.5, 1.0, 1.2], ref_gold=1.1)
    >>> s.peak_beta, s.beta_window()
    (1.0, (1.0, 2.0))
    """
    b = check_betas(betas)
    if np.unique(b).size != b.size:
        raise ValueError("betas must be distinct")
    arrays = []
    for name, values in (("kl", kl), ("proxy", proxy), ("gold", gold)):
        arr = np.asarray(values, dtype=float).reshape(-1)
        if arr.shape != b.shape or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be {b.size} finite numbers, one per beta, got {values!r}")
        arrays.append(arr)
    ref_gold = float(np.asarray(ref_gold, dtype=float))
    if not np.isfinite(ref_gold):
        raise ValueError(f"ref_gold must be a finite number, got {ref_gold!r}")
    order = np.argsort(-b)
    kl_s, proxy_s, gold_s = (a[order] for a in arrays)
    return SweepSummary(
        betas=b[order], kl=kl_s, proxy=proxy_s, gold=gold_s, ref_gold=ref_gold, peak=int(np.argmax(gold_s))
    )
