"""A real RLHF run on an output space small enough to enumerate (book section 11).

Sequences of ``T = 5`` tokens from a vocabulary of ``V = 8`` (``"abcdefg!"``): 8**5 = 32,768 sequences,
few enough that every probability, KL divergence and expected reward below is computed exactly by
summing over all of them. Only the training signal is sampled, as in real RLHF.

The pieces (book section 11 explains each):

1. **Reference policy** :math:`\\pi_\\mathrm{ref}`: a first-order Markov chain with Dirichlet rows, in
   which ``"!"`` is rare, so that sequences with two or more ``"!"`` hold a few percent of its mass.
2. **Gold reward**: per-token weights, a bonus for the first ``"!"``, a penalty for each further one, a
   penalty for each pair of equal adjacent tokens.
3. **Proxy reward**: a Bradley-Terry model, linear in the token counts plus a "has a ``!``" feature,
   fitted (MAP, Gaussian prior) to ``n_pairs`` preference pairs sampled from :math:`\\pi_\\mathrm{ref}`
   and labelled by the gold reward through a logistic. The features *can* express the saturation of
   ``"!"``, but only the rare sequences with two or more ``"!"`` tell the count weight apart from the
   indicator's; with few pairs the prior splits the first ``"!"``'s bonus between the two, and the
   proxy extrapolates "more ``!`` is better". It can never see the repeat penalty.
4. **Policy**: autoregressive, logits = reference logits + a learned table with one row per prefix
   (1 + 8 + 64 + 512 + 4096 = 4681 rows), zero at the start, so that :math:`\\pi_\\theta = \\pi_\\mathrm{ref}`
   at step 0 and any distribution over sequences, the optimum included, is representable.
5. **Training**: REINFORCE with per-token reward shaping (:func:`kltutorial.shape_rewards`, k1 from
   :func:`kltutorial.compute_token_kl`), rewards-to-go and a leave-one-out baseline; Adam on the table;
   :math:`\\beta` fixed or set by a :mod:`kltutorial.controllers` controller.
6. **Exact optimum**: :math:`\\pi^*_\\beta(y) \\propto \\pi_\\mathrm{ref}(y)\\, e^{r(y)/\\beta}`, and its
   (KL, reward) over :math:`\\beta`, the exact frontier; exact best-of-n.

Shapes: ``S = 32768`` sequences, ``T = 5`` positions, ``V = 8`` tokens, ``P = 4681`` prefixes, ``B`` batch.
Run ``python -m kltutorial.toyrlhf --help`` for the command-line β sweep.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from ._validation import (
    check_choice,
    check_coef,
    check_generator,
    check_positive,
    check_positive_int,
)
from .controllers import FixedKLController, KLController
from .estimators import compute_token_kl
from .objective import shape_rewards

__all__ = [
    "VOCAB",
    "BANG",
    "ToyTask",
    "TrainResult",
    "Frontier",
    "make_task",
    "train_policy",
    "exact_optimal_policy",
    "sequence_kl",
    "expected_reward",
    "exact_frontier",
    "best_of_n_logprobs",
    "best_of_n_kl_bound",
    "token_logprobs",
    "per_position_kl",
    "bang_count_distribution",
    "sample_sequences",
    "policy_logprobs",
    "ranking_agreement",
    "main",
]

VOCAB: tuple[str, ...] = ("a", "b", "c", "d", "e", "f", "g", "!")
BANG: int = 7  # index of the rare token "!"
V: int = len(VOCAB)
T: int = 5
S: int = V**T  # 32768 sequences
# Prefix ids: prefixes of length L occupy rows OFFSETS[L] ... OFFSETS[L] + V**L - 1.
OFFSETS: tuple[int, ...] = tuple((V**L - 1) // (V - 1) for L in range(T + 1))  # 0, 1, 9, 73, 585, 4681
P: int = OFFSETS[T]  # 4681 prefixes (lengths 0..4)
DTYPE = torch.float64
REWARDS = ("proxy", "gold")


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ToyTask:
    """Everything about the toy problem, enumerated. All tensors are float64 or int64.

    Attributes
    ----------
    sequences : Tensor, shape (S, T)
        Every sequence, in lexicographic order (sequence ``i`` is ``i`` written in base ``V``).
    ref_logprobs, gold_reward, proxy_reward : Tensor, shape (S,)
        :math:`\\log \\pi_\\mathrm{ref}(y)`, the gold reward and the fitted proxy reward of every sequence.
    bang_count : Tensor, shape (S,)
        Number of ``"!"`` in each sequence.
    prefix_ids : Tensor, shape (S, T)
        Row of the policy table used at each position of each sequence.
    ref_table : Tensor, shape (P, V)
        Reference next-token log-probs for every prefix (the Markov chain depends on the last token).
    ref_token_logprobs : Tensor, shape (S, T)
        :math:`\\log \\pi_\\mathrm{ref}(y_t \\mid y_{<t})` for every sequence and position.
    ref_initial, ref_transition : Tensor, shapes (V,), (V, V)
        The Markov chain: first-token distribution and transition matrix (rows sum to 1).
    gold_token_weights : Tensor, shape (V,)
        Per-token weights of the gold reward (0 for ``"!"``).
    features : Tensor, shape (S, V + 1)
        Proxy features: the count of each token, then 1 if the sequence has a ``"!"``.
    proxy_weights : Tensor, shape (V + 1,)
        Fitted Bradley-Terry weights, ``proxy_reward = features @ proxy_weights``.
    pairs : Tensor, shape (N, 2)
        Indices of the preference pairs; ``pair_labels[k]`` is True when ``pairs[k, 0]`` was preferred.
    pair_labels : Tensor, shape (N,)
    seed, n_pairs : int
    params : dict
        The remaining arguments of :func:`make_task`.
    """

    sequences: torch.Tensor
    ref_logprobs: torch.Tensor
    gold_reward: torch.Tensor
    proxy_reward: torch.Tensor
    bang_count: torch.Tensor
    prefix_ids: torch.Tensor
    ref_table: torch.Tensor
    ref_token_logprobs: torch.Tensor
    ref_initial: torch.Tensor
    ref_transition: torch.Tensor
    gold_token_weights: torch.Tensor
    features: torch.Tensor
    proxy_weights: torch.Tensor
    pairs: torch.Tensor
    pair_labels: torch.Tensor
    seed: int
    n_pairs: int
    params: dict = field(default_factory=dict)

    def reward(self, which: str) -> torch.Tensor:
        """``proxy_reward`` or ``gold_reward`` by name."""
        check_choice(which, "reward", REWARDS)
        return self.proxy_reward if which == "proxy" else self.gold_reward

    def decode(self, index: int) -> str:
        """The sequence with index ``index`` as a string, e.g. ``'ab!cd'``."""
        return "".join(VOCAB[int(t)] for t in self.sequences[index])


def _all_sequences() -> torch.Tensor:
    """Every sequence, lexicographic: digit t of index i in base V (most significant first)."""
    index = torch.arange(S)
    powers = V ** torch.arange(T - 1, -1, -1)
    return (index[:, None] // powers) % V  # (S, T)


def _prefix_ids(sequences: torch.Tensor) -> torch.Tensor:
    """Row of the prefix table for each position: OFFSETS[t] + (y_<t read in base V)."""
    ids = torch.empty_like(sequences)
    code = torch.zeros(sequences.shape[0], dtype=torch.long)
    for t in range(T):
        ids[:, t] = OFFSETS[t] + code
        code = code * V + sequences[:, t]
    return ids  # (S, T)


def _last_token_of_prefix() -> torch.Tensor:
    """For each prefix row, its last token (-1 for the empty prefix)."""
    last = torch.full((P,), -1, dtype=torch.long)
    for L in range(1, T):
        last[OFFSETS[L] : OFFSETS[L + 1]] = torch.arange(V**L) % V
    return last


def _rare_bang(probs: np.ndarray, bang_prob: float) -> np.ndarray:
    """Rescale a distribution so that "!" has probability ``bang_prob``, the rest keeping its shape."""
    out = probs.copy()
    out[:BANG] *= (1.0 - bang_prob) / out[:BANG].sum()
    out[BANG] = bang_prob
    return out


def _fit_bradley_terry(
    diff: torch.Tensor, labels: torch.Tensor, prior_precision: float
) -> torch.Tensor:
    """MAP Bradley-Terry weights: minimise sum_k BCE(w . diff_k, label_k) + (lambda / 2) ||w||^2.

    The loss is strictly convex (the prior makes it so), so L-BFGS finds the unique minimum.
    """
    w = torch.zeros(diff.shape[1], dtype=DTYPE, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w], lr=1.0, max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )
    n = diff.shape[0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        # Mean over pairs keeps the scale of the loss independent of N; the prior is divided by N
        # to match, so it weighs as a fixed number of pseudo-observations (a real prior).
        nll = torch.nn.functional.binary_cross_entropy_with_logits(diff @ w, labels)
        loss = nll + 0.5 * prior_precision * (w**2).sum() / n
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def make_task(
    seed: int = 0,
    n_pairs: int = 100,
    *,
    data_seed: int = 0,
    bang_prob: float = 0.08,
    dirichlet_alpha: float = 1.0,
    token_weight_scale: float = 0.5,
    bang_bonus: float = 3.0,
    bang_penalty: float = 1.5,
    repeat_penalty: float = 0.5,
    label_temperature: float = 2.0,
    label_flip: float = 0.0,
    prior_precision: float = 10.0,
) -> ToyTask:
    """Build the toy RLHF problem: reference chain, gold reward, preference data and fitted proxy.

    .. math::
        r_\\mathrm{gold}(y) = \\sum_t w_{y_t} + b\\,[n_!(y) \\ge 1] - c\\,\\max(n_!(y) - 1, 0)
        - \\rho \\sum_{t>0} [y_t = y_{t-1}]

    Preference labels: :math:`P(y^a \\succ y^b) = \\sigma((r_\\mathrm{gold}(y^a)
    - r_\\mathrm{gold}(y^b))/\\tau)`,
    each then flipped with probability ``label_flip``; both sequences of a pair are drawn from
    :math:`\\pi_\\mathrm{ref}`. The proxy is :math:`r_\\mathrm{proxy}(y) = \\phi(y)^\\top \\hat w`, with
    :math:`\\phi` the token counts and :math:`[n_! \\ge 1]`, and :math:`\\hat w` the MAP estimate under a
    :math:`\\mathcal{N}(0, 1/\\lambda)` prior.

    Parameters
    ----------
    seed : int
        Seeds the chain and the gold token weights (stream ``seed``) and the preference data
        (stream ``[seed, n_pairs, data_seed]``): tasks that differ only in ``n_pairs`` or
        ``data_seed`` share the chain and the gold reward.
    n_pairs : int
        Number N of preference pairs the proxy is fitted to, >= 1.
    data_seed : int
        Draws another preference data set of the same size, >= 0.
    bang_prob : float
        Probability of ``"!"`` at every position of the chain, in (0, 1).
    dirichlet_alpha : float
        Concentration of the Dirichlet rows of the chain, > 0.
    token_weight_scale : float
        Standard deviation of the gold per-token weights :math:`w`, >= 0.
    bang_bonus, bang_penalty, repeat_penalty : float
        :math:`b`, :math:`c`, :math:`\\rho` >= 0.
    label_temperature : float
        :math:`\\tau` > 0; larger means noisier labels.
    label_flip : float
        Probability of flipping each label, in [0, 0.5).
    prior_precision : float
        :math:`\\lambda` > 0 of the Gaussian prior on the proxy weights.

    Returns
    -------
    ToyTask
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    n_pairs = check_positive_int(n_pairs, "n_pairs")
    if isinstance(data_seed, bool) or not isinstance(data_seed, (int, np.integer)):
        raise TypeError(f"data_seed must be an int, got {type(data_seed).__name__}")
    if data_seed < 0:
        raise ValueError(f"data_seed must be >= 0, got {data_seed}")
    bang_prob = check_positive(bang_prob, "bang_prob")
    if bang_prob >= 1:
        raise ValueError(f"bang_prob must lie in (0, 1), got {bang_prob}")
    dirichlet_alpha = check_positive(dirichlet_alpha, "dirichlet_alpha")
    token_weight_scale = check_coef(token_weight_scale, "token_weight_scale")
    bang_bonus = check_coef(bang_bonus, "bang_bonus")
    bang_penalty = check_coef(bang_penalty, "bang_penalty")
    repeat_penalty = check_coef(repeat_penalty, "repeat_penalty")
    label_temperature = check_positive(label_temperature, "label_temperature")
    label_flip = check_coef(label_flip, "label_flip")
    if label_flip >= 0.5:
        raise ValueError(f"label_flip must lie in [0, 0.5), got {label_flip}")
    prior_precision = check_positive(prior_precision, "prior_precision")

    # 1. Reference chain (Dirichlet rows, "!" made rare) and its log-prob tables.
    rng = np.random.default_rng(seed)
    initial = _rare_bang(rng.dirichlet(np.full(V, dirichlet_alpha)), bang_prob)
    transition = np.stack(
        [_rare_bang(row, bang_prob) for row in rng.dirichlet(np.full(V, dirichlet_alpha), size=V)]
    )
    initial_t = torch.tensor(initial, dtype=DTYPE)
    transition_t = torch.tensor(transition, dtype=DTYPE)
    last = _last_token_of_prefix()
    ref_table = torch.where(
        (last >= 0)[:, None], transition_t.log()[last.clamp(min=0)], initial_t.log()[None, :]
    )  # (P, V)
    sequences = _all_sequences()
    prefix_ids = _prefix_ids(sequences)
    ref_token_logprobs = ref_table[prefix_ids, sequences]  # (S, T)
    ref_logprobs = ref_token_logprobs.sum(-1)

    # 2. Gold reward.
    w = rng.normal(0.0, token_weight_scale, V)
    w[BANG] = 0.0
    gold_weights = torch.tensor(w, dtype=DTYPE)
    counts = torch.nn.functional.one_hot(sequences, V).sum(1).to(DTYPE)  # (S, V)
    n_bang = counts[:, BANG]
    repeats = (sequences[:, 1:] == sequences[:, :-1]).sum(-1).to(DTYPE)
    gold = (
        counts @ gold_weights
        + bang_bonus * (n_bang >= 1).to(DTYPE)
        - bang_penalty * (n_bang - 1).clamp(min=0)
        - repeat_penalty * repeats
    )

    # 3. Preference pairs from the reference, labelled through a logistic, and the proxy fit.
    data_rng = np.random.default_rng([seed, n_pairs, data_seed])
    ref_p = ref_logprobs.exp().numpy()
    ref_p = ref_p / ref_p.sum()
    a = data_rng.choice(S, size=n_pairs, p=ref_p)
    b = data_rng.choice(S, size=n_pairs, p=ref_p)
    p_a = torch.sigmoid((gold[a] - gold[b]) / label_temperature).numpy()
    labels = data_rng.random(n_pairs) < p_a
    labels ^= data_rng.random(n_pairs) < label_flip
    features = torch.cat([counts, (n_bang >= 1).to(DTYPE)[:, None]], dim=1)  # (S, V + 1)
    labels_t = torch.tensor(labels, dtype=DTYPE)
    weights = _fit_bradley_terry(features[a] - features[b], labels_t, prior_precision)
    proxy = features @ weights

    return ToyTask(
        sequences=sequences,
        ref_logprobs=ref_logprobs,
        gold_reward=gold,
        proxy_reward=proxy,
        bang_count=n_bang.long(),
        prefix_ids=prefix_ids,
        ref_table=ref_table,
        ref_token_logprobs=ref_token_logprobs,
        ref_initial=initial_t,
        ref_transition=transition_t,
        gold_token_weights=gold_weights,
        features=features,
        proxy_weights=weights,
        pairs=torch.tensor(np.stack([a, b], axis=1)),
        pair_labels=torch.tensor(labels),
        seed=int(seed),
        n_pairs=n_pairs,
        params={
            "data_seed": int(data_seed),
            "bang_prob": bang_prob, "dirichlet_alpha": dirichlet_alpha,
            "token_weight_scale": token_weight_scale, "bang_bonus": bang_bonus,
            "bang_penalty": bang_penalty, "repeat_penalty": repeat_penalty,
            "label_temperature": label_temperature, "label_flip": label_flip,
            "prior_precision": prior_precision,
        },
    )


def _check_task(task: object) -> ToyTask:
    if not isinstance(task, ToyTask):
        raise TypeError(f"task must be a ToyTask (from make_task), got {type(task).__name__}")
    return task


def _check_logprobs(logprobs: object, name: str) -> torch.Tensor:
    if not isinstance(logprobs, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({S},), got {type(logprobs).__name__}")
    if not torch.is_floating_point(logprobs):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {logprobs.dtype}")
    if logprobs.shape != (S,):
        raise ValueError(f"{name} must have shape ({S},) (one log-prob per sequence), "
                         f"got {tuple(logprobs.shape)}")
    if torch.isnan(logprobs).any() or torch.isposinf(logprobs).any():
        raise ValueError(f"{name} contains NaN or +inf")
    return logprobs.to(DTYPE)


# ---------------------------------------------------------------------------------------------
# Exact quantities (sums over all S sequences)
# ---------------------------------------------------------------------------------------------


def sequence_kl(logp: torch.Tensor, logq: torch.Tensor) -> float:
    """Exact :math:`\\mathrm{KL}(p \\,\\|\\, q) = \\sum_y p(y) (\\log p(y) - \\log q(y))` in nats.

    Parameters
    ----------
    logp, logq : Tensor, shape (S,)
        Log-probabilities of every sequence (``-inf`` allowed for ``p``: those terms are 0).

    Returns
    -------
    float
    """
    logp = _check_logprobs(logp, "logp")
    logq = _check_logprobs(logq, "logq")
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return float(terms.sum())


def expected_reward(logp: torch.Tensor, reward: torch.Tensor) -> float:
    """Exact :math:`\\mathbb{E}_{y \\sim p}[r(y)] = \\sum_y p(y) r(y)`.

    Parameters
    ----------
    logp : Tensor, shape (S,)
    reward : Tensor, shape (S,)
    """
    logp = _check_logprobs(logp, "logp")
    if not isinstance(reward, torch.Tensor) or reward.shape != (S,):
        raise ValueError(f"reward must be a tensor of shape ({S},)")
    return float((logp.exp() * reward.to(DTYPE)).sum())


def exact_optimal_policy(task: ToyTask, beta: float, reward: str = "proxy") -> torch.Tensor:
    """Log-probs of the KL-regularised optimum :math:`\\pi^*_\\beta(y) = \\pi_\\mathrm{ref}(y)\\,
    e^{r(y)/\\beta} / Z_\\beta`.

    It maximises :math:`\\mathbb{E}_\\pi[r] - \\beta\\,\\mathrm{KL}(\\pi \\| \\pi_\\mathrm{ref})`, and for any
    :math:`\\pi`, :math:`\\mathrm{KL}(\\pi \\| \\pi^*_\\beta) = (J(\\pi^*_\\beta) - J(\\pi)) / \\beta`.

    Parameters
    ----------
    task : ToyTask
    beta : float
        :math:`\\beta` > 0.
    reward : {"proxy", "gold"}

    Returns
    -------
    Tensor, shape (S,)
    """
    task = _check_task(task)
    beta = check_positive(beta, "beta")
    logits = task.ref_logprobs + task.reward(reward) / beta
    return logits - torch.logsumexp(logits, 0)


@dataclass(frozen=True)
class Frontier:
    """Exact (KL, reward) of the optimal policies over a grid of β.

    Attributes
    ----------
    betas, kl, proxy, gold, multi_bang : ndarray, shape (K,)
        β, :math:`\\mathrm{KL}(\\pi^*_\\beta\\|\\pi_\\mathrm{ref})` (nats), expected proxy and gold reward,
        and the mass on sequences with two or more ``"!"``.
    reward : str
        Which reward the policies optimise.
    """

    betas: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray
    multi_bang: np.ndarray
    reward: str


def _summary(task: ToyTask, logp: torch.Tensor) -> tuple[float, float, float, float]:
    p = logp.exp()
    kl = torch.where(p > 0, p * (logp - task.ref_logprobs), torch.zeros_like(p)).sum()
    return (
        float(kl),
        float((p * task.proxy_reward).sum()),
        float((p * task.gold_reward).sum()),
        float(p[task.bang_count >= 2].sum()),
    )


def exact_frontier(
    task: ToyTask, betas: Sequence[float] | np.ndarray, reward: str = "proxy"
) -> Frontier:
    """The exact frontier: KL and expected rewards of :math:`\\pi^*_\\beta` for each β in ``betas``."""
    task = _check_task(task)
    betas = np.asarray(betas, dtype=float).reshape(-1)
    if betas.size == 0 or not np.all(np.isfinite(betas)) or np.any(betas <= 0):
        raise ValueError("betas must be a non-empty sequence of finite numbers > 0")
    rows = [_summary(task, exact_optimal_policy(task, float(b), reward)) for b in betas]
    kl, proxy, gold, multi = (np.array(c) for c in zip(*rows, strict=True))
    return Frontier(betas=betas, kl=kl, proxy=proxy, gold=gold, multi_bang=multi, reward=reward)


def best_of_n_logprobs(task: ToyTask, n: int, reward: str = "proxy") -> torch.Tensor:
    """Exact log-probs of best-of-n: draw n sequences from :math:`\\pi_\\mathrm{ref}`, keep the best.

    With :math:`F(r) = \\pi_\\mathrm{ref}(r(Y) \\le r)` and ties broken uniformly among the draws,
    a group of sequences sharing the reward value :math:`r` gets probability
    :math:`F(r)^n - F(r^-)^n`, split in proportion to :math:`\\pi_\\mathrm{ref}`. Its KL from
    :math:`\\pi_\\mathrm{ref}` is at most :math:`\\log n - (n-1)/n` (:func:`best_of_n_kl_bound`), with
    equality when no two sequences tie.

    Parameters
    ----------
    task : ToyTask
    n : int
        Number of draws, >= 1 (n = 1 is :math:`\\pi_\\mathrm{ref}`).
    reward : {"proxy", "gold"}
        The reward used to pick the best.

    Returns
    -------
    Tensor, shape (S,)
        Log-probs; ``-inf`` where the probability underflows to 0.
    """
    task = _check_task(task)
    n = check_positive_int(n, "n")
    r = task.reward(reward)
    values, group = torch.unique(r, return_inverse=True)  # sorted ascending
    ref_p = task.ref_logprobs.exp()
    group_mass = torch.zeros(values.shape[0], dtype=DTYPE).index_add_(0, group, ref_p)
    cdf_above = group_mass.cumsum(0).clamp(max=1.0)  # F(r)
    cdf_below = torch.cat([torch.zeros(1, dtype=DTYPE), cdf_above[:-1]])  # F(r^-)
    # log(F_above^n - F_below^n) = n log F_above + log(1 - (F_below / F_above)^n), computed stably.
    log_above = n * cdf_above.log()
    ratio_n = torch.exp(n * (cdf_below.log() - cdf_above.log()))
    log_group = log_above + torch.log1p(-ratio_n)
    logp = task.ref_logprobs - group_mass.log()[group] + log_group[group]
    return logp - torch.logsumexp(logp, 0)  # renormalise away rounding


def best_of_n_kl_bound(n: int | np.ndarray) -> float | np.ndarray:
    """The analytic best-of-n KL, :math:`\\log n - (n - 1)/n` nats (exact without ties, else a bound)."""
    n_arr = np.asarray(n, dtype=float)
    if np.any(n_arr < 1):
        raise ValueError(f"n must be >= 1, got {n}")
    out = np.log(n_arr) - (n_arr - 1.0) / n_arr
    return float(out) if out.ndim == 0 else out


def _prefix_marginals(logp: torch.Tensor) -> list[torch.Tensor]:
    """log P(y_<t) for t = 0..T, each broadcast to shape (V,)*T."""
    p = logp.exp().reshape((V,) * T)
    out = []
    for t in range(T + 1):
        m = p.sum(dim=tuple(range(t, T)), keepdim=True) if t < T else p
        out.append(m.log().expand((V,) * T))
    return out


def token_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token conditionals :math:`\\log p(y_t \\mid y_{<t})` of a distribution over sequences.

    Computed from the sequence log-probs alone through the prefix marginals,
    :math:`\\log p(y_t \\mid y_{<t}) = \\log p(y_{\\le t}) - \\log p(y_{<t})`, so it works for any
    distribution (trained policy, :math:`\\pi^*_\\beta`, best-of-n). Positions whose prefix has
    probability 0 get 0.

    Parameters
    ----------
    logprobs : Tensor, shape (S,)

    Returns
    -------
    Tensor, shape (S, T)
    """
    logprobs = _check_logprobs(logprobs, "logprobs")
    marg = _prefix_marginals(logprobs)
    cols = []
    for t in range(T):
        cond = marg[t + 1] - marg[t]
        cols.append(torch.where(torch.isfinite(marg[t]), cond, torch.zeros_like(cond)).reshape(S))
    return torch.stack(cols, dim=1)


def per_position_kl(task: ToyTask, logprobs: torch.Tensor) -> np.ndarray:
    """Exact KL at each position: :math:`\\mathbb{E}_{y_{<t} \\sim p}\\,\\mathrm{KL}(p(\\cdot \\mid y_{<t})
    \\,\\|\\, \\pi_\\mathrm{ref}(\\cdot \\mid y_{<t}))`.

    By the chain rule these sum to the sequence KL :math:`\\mathrm{KL}(p \\| \\pi_\\mathrm{ref})`.

    Returns
    -------
    ndarray, shape (T,)
    """
    task = _check_task(task)
    logprobs = _check_logprobs(logprobs, "logprobs")
    p = logprobs.exp()
    delta = token_logprobs(logprobs) - task.ref_token_logprobs  # (S, T)
    terms = torch.where(p[:, None] > 0, p[:, None] * delta, torch.zeros_like(delta))
    return terms.sum(0).numpy()


def bang_count_distribution(task: ToyTask, logprobs: torch.Tensor) -> np.ndarray:
    """Probability of each number of ``"!"`` (0 to T) under the distribution ``logprobs``.

    Returns
    -------
    ndarray, shape (T + 1,)
    """
    task = _check_task(task)
    p = _check_logprobs(logprobs, "logprobs").exp()
    return torch.zeros(T + 1, dtype=DTYPE).index_add_(0, task.bang_count, p).numpy()


def sample_sequences(
    logprobs: torch.Tensor, n: int, generator: torch.Generator
) -> torch.Tensor:
    """Indices of ``n`` sequences drawn (with replacement) from the distribution ``logprobs``.

    Returns
    -------
    Tensor, shape (n,), int64
    """
    logprobs = _check_logprobs(logprobs, "logprobs")
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    return torch.multinomial(logprobs.exp(), n, replacement=True, generator=generator)


def ranking_agreement(
    task: ToyTask, n: int, generator: torch.Generator, min_bangs: int = 0
) -> float:
    """How often the proxy orders a pair as the gold reward does (pairs with unequal gold rewards).

    Pairs are drawn from :math:`\\pi_\\mathrm{ref}` restricted to sequences with at least ``min_bangs``
    ``"!"``; the result is the fraction of the ``n`` pairs (ties in gold dropped) on which
    :math:`\\mathrm{sign}(\\Delta r_\\mathrm{proxy}) = \\mathrm{sign}(\\Delta r_\\mathrm{gold})`.
    """
    task = _check_task(task)
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    if isinstance(min_bangs, bool) or not isinstance(min_bangs, int) or not 0 <= min_bangs <= T:
        raise ValueError(f"min_bangs must be an int in [0, {T}], got {min_bangs!r}")
    logp = torch.where(task.bang_count >= min_bangs, task.ref_logprobs, -torch.inf)
    logp = logp - torch.logsumexp(logp, 0)
    a = sample_sequences(logp, n, generator)
    b = sample_sequences(logp, n, generator)
    dg = task.gold_reward[a] - task.gold_reward[b]
    dp = task.proxy_reward[a] - task.proxy_reward[b]
    keep = dg != 0
    return float((torch.sign(dg[keep]) == torch.sign(dp[keep])).to(DTYPE).mean())


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult:
    """A trained policy and its per-step history (exact quantities by enumeration).

    Attributes
    ----------
    logprobs : Tensor, shape (S,)
        Log-prob of every sequence under the final policy.
    table : Tensor, shape (P, V)
        The learned logit offsets (policy logits = ``task.ref_table`` + ``table``).
    kl : ndarray, shape (steps,)
        Exact :math:`\\mathrm{KL}(\\pi_\\theta \\| \\pi_\\mathrm{ref})` (nats) of the policy that
        sampled step t.
    kl_sampled : ndarray, shape (steps,)
        The batch mean of the per-sequence k1 sum at step t: what the controller saw.
    beta : ndarray, shape (steps + 1,)
        β in force at step t; the last entry is the β after the final update.
    proxy, gold : ndarray, shape (steps,)
        Exact expected rewards of the policy that sampled step t.
    """

    logprobs: torch.Tensor
    table: torch.Tensor
    kl: np.ndarray
    kl_sampled: np.ndarray
    beta: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray


def policy_logprobs(task: ToyTask, table: torch.Tensor) -> torch.Tensor:
    """Exact log-prob of every sequence under logits ``task.ref_table + table`` (one gather).

    Parameters
    ----------
    task : ToyTask
    table : Tensor, shape (P, V)

    Returns
    -------
    Tensor, shape (S,)
    """
    cond = torch.log_softmax(task.ref_table + table, dim=-1)  # (P, V)
    return cond[task.prefix_ids, task.sequences].sum(-1)


def _sample_batch(cond: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
    """Ancestral sampling: one token at a time from the next-token table; returns sequence indices."""
    code = torch.zeros(batch, dtype=torch.long)
    probs = cond.exp()
    for t in range(T):
        rows = probs[OFFSETS[t] + code]  # (B, V)
        tok = torch.multinomial(rows, 1, generator=generator).squeeze(1)
        code = code * V + tok
    return code  # index of the sequence in task.sequences


def _critic_update(
    value: torch.Tensor, visits: torch.Tensor, rows: torch.Tensor, returns: torch.Tensor,
    min_step: float,
) -> None:
    """Move the value table towards the batch mean of the returns seen at each visited prefix.

    ``value[h] += a_h (mean of G over the visits of h in the batch - value[h])`` with
    ``a_h = max(n_h / (visits so far), min_step)``: a running mean at first, then an exponential
    average that can follow the policy as it moves. In place; rows not visited are left alone.
    """
    rows, returns = rows.reshape(-1), returns.reshape(-1)
    n_h = torch.zeros_like(value).index_add_(0, rows, torch.ones_like(returns))
    sum_h = torch.zeros_like(value).index_add_(0, rows, returns)
    visits += n_h
    step = torch.clamp(n_h / visits.clamp(min=1.0), min=min_step)
    hit = n_h > 0
    value[hit] += step[hit] * (sum_h[hit] / n_h[hit] - value[hit])


def train_policy(
    task: ToyTask,
    beta: float | None = None,
    controller: KLController | None = None,
    *,
    steps: int = 400,
    batch_size: int = 2048,
    lr: float = 0.1,
    seed: int = 0,
    progress: bool = False,
) -> TrainResult:
    """Train the table policy with REINFORCE on the proxy reward minus a per-token KL penalty.

    Each step:

    1. sample ``batch_size`` sequences from :math:`\\pi_\\theta` (ancestral, ``torch.Generator``);
    2. per-token k1, :math:`\\mathrm{kl}_t = \\log\\pi_\\theta(y_t|y_{<t})
       - \\log\\pi_\\mathrm{ref}(y_t|y_{<t})` (:func:`~kltutorial.compute_token_kl`), and shaped
       rewards :math:`r_t = -\\beta\\,\\mathrm{kl}_t`
       plus the proxy score at the last token (:func:`~kltutorial.shape_rewards`);
    3. rewards-to-go :math:`G_t = \\sum_{s \\ge t} r_s`, and the advantage :math:`A_t = G_t - b(y_{<t})`
       with the baseline :math:`b` a value table, one entry per prefix, fitted to past returns (a
       Monte-Carlo critic, as PPO's value head); for a prefix never seen before, the leave-one-out
       batch mean of :math:`G_t`;
    4. loss :math:`-\\frac{1}{B}\\sum_i \\sum_t A^i_t \\log\\pi_\\theta(y^i_t|y^i_{<t})`, one Adam step; then
       the critic moves towards this batch's returns;
    5. the controller sees the batch mean of :math:`\\sum_t \\mathrm{kl}_t` (``n_steps = batch_size``,
       as TRL counts).

    This is an unbiased gradient of :math:`J(\\theta) = \\mathbb{E}_{\\pi_\\theta}[r - \\beta \\log
    (\\pi_\\theta/\\pi_\\mathrm{ref})]`: differentiating the log-ratio adds
    :math:`-\\beta\\,\\mathbb{E}[\\nabla \\log \\pi_\\theta] = 0`; a token's score is uncorrelated with the
    KL of earlier tokens given its prefix, so rewards-to-go may drop them; and the baseline depends
    only on the prefix and on earlier batches. The learning rate decays linearly to 0 over the second
    half of training, which removes most of the noise floor.

    Every probability the histories record is exact (a sum over all S sequences); only the gradient is
    sampled. The loop runs with one torch thread (the previous setting is restored on return): its
    tensors are small, and extra threads only add contention on a shared machine.

    Parameters
    ----------
    task : ToyTask
    beta : float, optional
        A fixed β > 0. Exactly one of ``beta`` and ``controller``.
    controller : KLController, optional
        Sets β at every step (its ``update`` is called once per step and its state changes).
    steps : int
        Number of steps, >= 1. The defaults bring every β in [0.1, 1] within 0.05 nats of
        :math:`\\pi^*_\\beta` (book section 11 measures it).
    batch_size : int
        Sequences per step, >= 2.
    lr : float
        Adam learning rate, > 0.
    seed : int
        Seeds the sampling generator.
    progress : bool
        Show a tqdm bar (keep False in notebooks).

    Returns
    -------
    TrainResult
    """
    task = _check_task(task)
    if (beta is None) == (controller is None):
        raise ValueError("pass exactly one of beta (a fixed coefficient) and controller")
    if controller is None:
        controller = FixedKLController(check_positive(beta, "beta"))
    elif not isinstance(controller, KLController):
        raise TypeError(
            f"controller must be a KLController (e.g. AdaptiveKLController), "
            f"got {type(controller).__name__}"
        )
    steps = check_positive_int(steps, "steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 (leave-one-out baseline), got {batch_size}")
    lr = check_positive(lr, "lr")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    generator = torch.Generator().manual_seed(int(seed))

    # The tensors are tiny: one thread is several times faster than many on a shared machine.
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(task, controller, steps, batch_size, lr, generator, progress)
    finally:
        torch.set_num_threads(n_threads)


def _train(
    task: ToyTask, controller: KLController, steps: int, batch_size: int, lr: float,
    generator: torch.Generator, progress: bool,
) -> TrainResult:
    """The loop of :func:`train_policy` (arguments already checked)."""
    table = torch.zeros(P, V, dtype=DTYPE, requires_grad=True)  # pi_theta = pi_ref at step 0
    opt = torch.optim.Adam([table], lr=lr)
    decay_start = steps // 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < decay_start else max(0.0, (steps - s) / (steps - decay_start))
    )
    value = torch.zeros(P, dtype=DTYPE)  # critic: expected reward-to-go from each prefix
    visits = torch.zeros(P, dtype=DTYPE)
    mask = torch.ones(batch_size, T, dtype=torch.bool)  # every sequence has all T tokens
    hist: dict[str, list[float]] = {"kl": [], "kl_sampled": [], "proxy": [], "gold": []}
    betas = [controller.value]

    for _ in tqdm(range(steps), disable=not progress, desc="training", leave=False):
        b = controller.value
        cond = torch.log_softmax(task.ref_table + table, dim=-1)  # (P, V)
        with torch.no_grad():
            kl, proxy, gold, _ = _summary(task, cond[task.prefix_ids, task.sequences].sum(-1))
            idx = _sample_batch(cond.detach(), batch_size, generator)  # 1. (B,)
        rows = task.prefix_ids[idx]  # (B, T)
        logp_tok = cond[rows, task.sequences[idx]]  # (B, T)
        with torch.no_grad():
            per_tok, per_seq = compute_token_kl(  # 2.
                logp_tok.detach(), task.ref_token_logprobs[idx], estimator="k1", reduction="sum"
            )
            rewards = shape_rewards(task.proxy_reward[idx], per_tok, mask, kl_coef=b)  # (B, T)
            togo = rewards.flip(-1).cumsum(-1).flip(-1)  # 3. G_t, (B, T)
            loo = (togo.sum(0, keepdim=True) - togo) / (batch_size - 1)
            adv = togo - torch.where(visits[rows] > 0, value[rows], loo)
        loss = -(adv * logp_tok).sum(-1).mean()  # 4.
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        _critic_update(value, visits, rows, togo, min_step=0.2)
        controller.update(float(per_seq.mean()), n_steps=batch_size)  # 5.
        hist["kl"].append(kl)
        hist["kl_sampled"].append(float(per_seq.mean()))
        hist["proxy"].append(proxy)
        hist["gold"].append(gold)
        betas.append(controller.value)

    final = table.detach().clone()
    return TrainResult(
        logprobs=policy_logprobs(task, final),
        table=final,
        kl=np.array(hist["kl"]),
        kl_sampled=np.array(hist["kl_sampled"]),
        beta=np.array(betas),
        proxy=np.array(hist["proxy"]),
        gold=np.array(hist["gold"]),
    )


# ---------------------------------------------------------------------------------------------
# Command line: the β sweep
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Run the β sweep and print KL, rewards and the distance to the exact optimum for each β."""
    parser = argparse.ArgumentParser(
        prog="python -m kltutorial.toyrlhf",
        description="Train the toy RLHF policy for several β and compare each with the exact "
        "optimum pi*_beta(y) ∝ pi_ref(y) exp(r(y)/beta) (book section 11).",
    )
    parser.add_argument("--seed", type=int, default=0, help="task and training seed (default 0)")
    parser.add_argument("--n-pairs", type=int, default=100,
                        help="preference pairs the proxy is fitted to (default 100)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per β (default 400)")
    parser.add_argument("--batch-size", type=int, default=2048,
                        help="sequences per step (default 2048)")
    parser.add_argument("--lr", type=float, default=0.1, help="Adam learning rate (default 0.1)")
    parser.add_argument("--betas", type=float, nargs="+", default=[1.0, 0.5, 0.3, 0.2, 0.15, 0.1],
                        help="KL coefficients to train (default 1 0.5 0.3 0.2 0.15 0.1)")
    args = parser.parse_args(argv)
    if any(not math.isfinite(b) or b <= 0 for b in args.betas):
        parser.error("--betas must all be > 0")
    try:  # bad values (--steps 0, --n-pairs -1, ...) are reported like argparse's own errors
        task = make_task(seed=args.seed, n_pairs=args.n_pairs)
        train_policy(task, beta=args.betas[0], steps=1, batch_size=args.batch_size, lr=args.lr,
                     seed=args.seed)
        check_positive_int(args.steps, "--steps")
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    rows = []
    for b in tqdm(args.betas, desc="β sweep"):
        res = train_policy(task, beta=b, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           seed=args.seed)
        kl, proxy, gold, _ = _summary(task, res.logprobs)
        rows.append({
            "beta": b, "kl": kl, "proxy": proxy, "gold": gold,
            "kl_to_opt": sequence_kl(res.logprobs, exact_optimal_policy(task, b)),
            "opt_kl": _summary(task, exact_optimal_policy(task, b))[0],
        })
    print(f"{'beta':>6} {'KL':>8} {'KL*':>8} {'proxy':>8} {'gold':>8} {'KL(pi||pi*)':>12}")
    for r in rows:
        print(f"{r['beta']:>6.3g} {r['kl']:>8.3f} {r['opt_kl']:>8.3f} {r['proxy']:>8.3f} "
              f"{r['gold']:>8.3f} {r['kl_to_opt']:>12.4f}")
    return rows


if __name__ == "__main__":
    main()
