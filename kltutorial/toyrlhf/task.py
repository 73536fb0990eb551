r"""The toy RLHF task of book section 11: reference chain, gold reward, preference data, proxy reward.

Sequences of ``LENGTH = 5`` tokens from ``VOCAB = "abcdefg!"``: 8**5 = 32,768 sequences, listed by a
:class:`~kltutorial.exact.SequenceSpace`, so that every exact quantity of the experiment is a call to
:mod:`kltutorial.exact`. This module builds what those calls are about:

1. the reference policy :math:`\pi_\mathrm{ref}`, a first-order Markov chain with Dirichlet rows in
   which ``"!"`` is rare;
2. the gold reward, what we want: per-token weights, a bonus for the first ``"!"``, a penalty for each
   further one, a penalty for each pair of equal neighbours;
3. the proxy reward, what training sees: a Bradley–Terry model linear in the token counts and a
   "has a ``!``" feature, fitted (MAP, Gaussian prior) to preference pairs drawn from
   :math:`\pi_\mathrm{ref}` and labelled through a logistic of the gold reward. Only the rare sequences
   with two or more ``"!"`` tell the count weight from the indicator's, so with few pairs the prior
   splits the first ``"!"``'s bonus between the two and the proxy extrapolates "more ``!`` is better". It
   can never see the repeat penalty.

Shapes: V = 8 tokens, T = 5 positions, V**T = 32,768 sequences, P = 4681 prefixes, N preference pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import exact as ex
from .._validation import check_choice, check_generator, check_positive_int, check_rng
from .config import TaskConfig

__all__ = [
    "VOCAB",
    "BANG",
    "LENGTH",
    "HAS_BANG",
    "REWARDS",
    "ToyTask",
    "ToyFrontier",
    "make_task",
    "exact_frontier",
    "bang_count_distribution",
    "ranking_agreement",
]

#: The V = 8 tokens, ``"!"`` last.
VOCAB: tuple[str, ...] = ("a", "b", "c", "d", "e", "f", "g", "!")
BANG: int = 7  #: Index of the rare token ``"!"`` in ``VOCAB``.
LENGTH: int = 5  #: T, tokens per sequence.
HAS_BANG: int = len(VOCAB)  #: Column of the proxy's "has a ``!``" feature, after the V token counts.
#: The two rewards of the task, as :meth:`ToyTask.reward` names them.
REWARDS: tuple[str, ...] = ("proxy", "gold")
_DTYPE = torch.float64  # exact sums over 32,768 sequences: float64 throughout


@dataclass(frozen=True, eq=False)
class ToyTask:
    """Everything about the toy problem, enumerated; tensors are float64 or int64.

    Attributes
    ----------
    config : TaskConfig
    space : SequenceSpace
        The V**T sequences (``space.sequences``) and their prefix rows (``space.prefix_ids``).
    ref_initial, ref_transition : Tensor, shapes (V,), (V, V)
        The Markov chain :math:`\\pi_\\mathrm{ref}`: first-token distribution and transition matrix.
    ref_table : Tensor, shape (P, V)
        Next-token log-probs of :math:`\\pi_\\mathrm{ref}` at every prefix (those of the chain's last token).
    ref_token_logprobs : Tensor, shape (V**T, T)
        :math:`\\log \\pi_\\mathrm{ref}(y_t \\mid y_{<t})` for every sequence and position.
    ref_logprobs : Tensor, shape (V**T,)
        :math:`\\log \\pi_\\mathrm{ref}(y)`.
    gold_token_weights : Tensor, shape (V,)
        Per-token weights :math:`w` of the gold reward (0 for ``"!"``).
    gold_reward, proxy_reward : Tensor, shape (V**T,)
        The gold reward and the fitted proxy reward of every sequence.
    bang_count : Tensor, shape (V**T,), int64
        Number of ``"!"`` in each sequence.
    features : Tensor, shape (V**T, V + 1)
        Proxy features: the count of each token, then 1 if the sequence has a ``"!"`` (column ``HAS_BANG``).
    proxy_weights : Tensor, shape (V + 1,)
        Fitted Bradley–Terry weights, ``proxy_reward = features @ proxy_weights``.
    pairs : Tensor, shape (N, 2), int64
        Sequence indices of the preference pairs.
    pair_labels : Tensor, shape (N,), bool
        True where ``pairs[k, 0]`` was preferred.
    """

    config: TaskConfig
    space: ex.SequenceSpace
    ref_initial: torch.Tensor
    ref_transition: torch.Tensor
    ref_table: torch.Tensor
    ref_token_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    gold_token_weights: torch.Tensor
    gold_reward: torch.Tensor
    proxy_reward: torch.Tensor
    bang_count: torch.Tensor
    features: torch.Tensor
    proxy_weights: torch.Tensor
    pairs: torch.Tensor
    pair_labels: torch.Tensor

    def reward(self, which: str) -> torch.Tensor:
        """``proxy_reward`` or ``gold_reward`` by name."""
        check_choice(which, "reward", REWARDS)
        return self.proxy_reward if which == "proxy" else self.gold_reward

    def decode(self, index: int) -> str:
        """The sequence with index ``index`` as a string, e.g. ``'ab!cd'``."""
        return "".join(VOCAB[int(t)] for t in self.space.sequences[index])


@dataclass(frozen=True)
class ToyFrontier:
    """Exact (KL, reward) of the optimal policies :math:`\\pi^*_\\beta` of the task over a grid of β.

    Attributes
    ----------
    betas, kl, proxy, gold, multi_bang : ndarray, shape (K,)
        β, :math:`\\mathrm{KL}(\\pi^*_\\beta\\|\\pi_\\mathrm{ref})` (nats), expected proxy and gold reward,
        and the mass on sequences with two or more ``"!"``.
    reward : str
        Which reward the policies optimise, ``"proxy"`` or ``"gold"``.
    """

    betas: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray
    multi_bang: np.ndarray
    reward: str


# ---------------------------------------------------------------------------------------------
# Building the task


def make_task(config: TaskConfig, rng: np.random.Generator, data_rng: np.random.Generator) -> ToyTask:
    """Build the toy RLHF problem: reference chain, gold reward, preference data and fitted proxy.

    .. math::
        r_\\mathrm{gold}(y) = \\sum_t w_{y_t} + b\\,[n_!(y) \\ge 1] - c\\,\\max(n_!(y) - 1, 0)
        - \\rho \\sum_{t>0} [y_t = y_{t-1}]

    Preference labels: :math:`P(y^a \\succ y^b) = \\sigma((r_\\mathrm{gold}(y^a) - r_\\mathrm{gold}(y^b))
    /\\tau)`, each then flipped with probability ``label_flip``; both sequences of a pair are drawn from
    :math:`\\pi_\\mathrm{ref}`. The proxy is :math:`r_\\mathrm{proxy}(y) = \\phi(y)^\\top \\hat w`, with
    :math:`\\phi` the token counts and :math:`[n_! \\ge 1]`, and :math:`\\hat w` the MAP estimate under a
    :math:`\\mathcal{N}(0, 1/\\lambda)` prior. The symbols are the fields of :class:`TaskConfig`.

    Parameters
    ----------
    config : TaskConfig
    rng : numpy.random.Generator
        Draws the chain and the gold token weights.
    data_rng : numpy.random.Generator
        Draws the preference pairs and their labels. A separate generator, so that tasks built with
        generators in the same state for ``rng`` share the chain and the gold reward, and differ only in
        their data (book section 11 keys it by ``[seed, n_pairs, data set]``).

    Returns
    -------
    ToyTask
    """
    if not isinstance(config, TaskConfig):
        raise TypeError(
            f"config must be a TaskConfig (e.g. TaskConfig(n_pairs=100)), got {type(config).__name__}"
        )
    rng = check_rng(rng, "rng")
    data_rng = check_rng(data_rng, "data_rng")
    space = ex.SequenceSpace(len(VOCAB), LENGTH)
    V = space.vocab_size

    # 1. Reference chain (Dirichlet rows, "!" made rare) and its next-token table.
    initial = _rare_bang(rng.dirichlet(np.full(V, config.dirichlet_alpha)), config.bang_prob)
    transition = np.stack([
        _rare_bang(row, config.bang_prob)
        for row in rng.dirichlet(np.full(V, config.dirichlet_alpha), size=V)
    ])
    initial_t = torch.tensor(initial, dtype=_DTYPE)
    transition_t = torch.tensor(transition, dtype=_DTYPE)
    ref_table = _chain_table(space, initial_t, transition_t)  # (P, V)
    ref_token_logprobs = ex.token_logprobs(space, ref_table)  # (V**T, T)
    ref_logprobs = ref_token_logprobs.sum(-1)  # chain rule: log pi_ref(y) = sum_t log pi_ref(y_t | y_<t)

    # 2. Gold reward.
    w = rng.normal(0.0, config.token_weight_scale, V)
    w[BANG] = 0.0
    gold_weights = torch.tensor(w, dtype=_DTYPE)
    counts = torch.nn.functional.one_hot(space.sequences, V).sum(1).to(_DTYPE)  # (V**T, V)
    n_bang = counts[:, BANG]
    repeats = (space.sequences[:, 1:] == space.sequences[:, :-1]).sum(-1).to(_DTYPE)
    gold = (
        counts @ gold_weights
        + config.bang_bonus * (n_bang >= 1).to(_DTYPE)
        - config.bang_penalty * (n_bang - 1).clamp(min=0)
        - config.repeat_penalty * repeats
    )

    # 3. Preference pairs from the reference, labelled through a logistic of the gold reward.
    n = config.n_pairs
    ref_p = ref_logprobs.exp().numpy()
    ref_p = ref_p / ref_p.sum()
    a = data_rng.choice(space.n_sequences, size=n, p=ref_p)
    b = data_rng.choice(space.n_sequences, size=n, p=ref_p)
    p_a = torch.sigmoid((gold[a] - gold[b]) / config.label_temperature).numpy()
    labels = data_rng.random(n) < p_a
    labels ^= data_rng.random(n) < config.label_flip

    # 4. The proxy: Bradley-Terry on the features, fitted to the pairs.
    features = torch.cat([counts, (n_bang >= 1).to(_DTYPE)[:, None]], dim=1)  # (V**T, V + 1)
    weights = _fit_bradley_terry(
        features[a] - features[b], torch.tensor(labels, dtype=_DTYPE), config.prior_precision
    )

    return ToyTask(
        config=config,
        space=space,
        ref_initial=initial_t,
        ref_transition=transition_t,
        ref_table=ref_table,
        ref_token_logprobs=ref_token_logprobs,
        ref_logprobs=ref_logprobs,
        gold_token_weights=gold_weights,
        gold_reward=gold,
        proxy_reward=features @ weights,
        bang_count=n_bang.long(),
        features=features,
        proxy_weights=weights,
        pairs=torch.tensor(np.stack([a, b], axis=1)),
        pair_labels=torch.tensor(labels),
    )


def _rare_bang(probs: np.ndarray, bang_prob: float) -> np.ndarray:
    """Rescale a distribution so that "!" has probability ``bang_prob``, the rest keeping its shape."""
    out = probs.copy()
    out[:BANG] *= (1.0 - bang_prob) / out[:BANG].sum()
    out[BANG] = bang_prob
    return out


def _chain_table(
    space: ex.SequenceSpace, initial: torch.Tensor, transition: torch.Tensor
) -> torch.Tensor:
    """Next-token log-probs of the Markov chain at every prefix: a row of the chain's last token."""
    V = space.vocab_size
    rows = [initial.log()[None, :]]  # the empty prefix
    for L in range(1, space.length):
        last = torch.arange(V**L) % V  # last token of each prefix of length L, in row order
        rows.append(transition.log()[last])
    return torch.cat(rows)  # (P, V)


def _fit_bradley_terry(
    diff: torch.Tensor, labels: torch.Tensor, prior_precision: float
) -> torch.Tensor:
    """MAP Bradley-Terry weights: minimise mean_k BCE(w . diff_k, label_k) + lambda ||w||^2 / (2 N).

    The loss is strictly convex (the prior makes it so), so L-BFGS finds the unique minimum.
    """
    w = torch.zeros(diff.shape[1], dtype=_DTYPE, requires_grad=True)
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


# ---------------------------------------------------------------------------------------------
# Exact quantities of the task (through kltutorial.exact)


def check_task(task: object) -> ToyTask:
    if not isinstance(task, ToyTask):
        raise TypeError(f"task must be a ToyTask (from make_task), got {type(task).__name__}")
    return task


def exact_frontier(
    task: ToyTask, betas: Sequence[float] | np.ndarray, reward: str = "proxy"
) -> ToyFrontier:
    """The exact frontier of the task: KL, expected proxy and gold reward, and the mass on two or more
    ``"!"`` of :math:`\\pi^*_\\beta \\propto \\pi_\\mathrm{ref}\\, e^{r/\\beta}` for each β in ``betas``
    (:func:`kltutorial.exact.optimal_frontier`).

    Parameters
    ----------
    task : ToyTask
    betas : sequence of float, length K
        Each > 0.
    reward : {"proxy", "gold"}
        The reward :math:`r` the policies optimise.

    Returns
    -------
    ToyFrontier
    """
    task = check_task(task)
    r = task.reward(reward)
    measures = {
        "proxy": task.proxy_reward,
        "gold": task.gold_reward,
        "multi_bang": (task.bang_count >= 2).to(_DTYPE),
    }
    f = ex.optimal_frontier(task.ref_logprobs, r, betas, measures)
    return ToyFrontier(
        betas=f.betas,
        kl=f.kl,
        proxy=f.measures["proxy"],
        gold=f.measures["gold"],
        multi_bang=f.measures["multi_bang"],
        reward=reward,
    )


def bang_count_distribution(task: ToyTask, logprobs: torch.Tensor) -> np.ndarray:
    """Probability of each number of ``"!"``, :math:`P(n_! = k) = \\mathbb{E}_p[\\,[n_!(y) = k]\\,]`,
    for k = 0 to T.

    Parameters
    ----------
    task : ToyTask
    logprobs : Tensor, shape (V**T,)
        A distribution over the task's sequences.

    Returns
    -------
    ndarray, shape (T + 1,)
    """
    task = check_task(task)
    n = task.space.n_sequences
    if not isinstance(logprobs, torch.Tensor) or logprobs.shape != (n,):
        shape = tuple(logprobs.shape) if isinstance(logprobs, torch.Tensor) else type(logprobs).__name__
        raise ValueError(f"logprobs must be a tensor of shape ({n},), one log-prob per sequence; got {shape}")
    return np.array([
        ex.expected_reward(logprobs, (task.bang_count == k).to(_DTYPE))
        for k in range(task.space.length + 1)
    ])


def ranking_agreement(
    task: ToyTask, n: int, generator: torch.Generator, min_bangs: int = 0
) -> float:
    """How often the proxy orders a pair as the gold reward does (pairs with unequal gold rewards).

    Pairs are drawn from :math:`\\pi_\\mathrm{ref}` restricted to sequences with at least ``min_bangs``
    ``"!"``; the result is the fraction of the ``n`` pairs (ties in gold dropped) on which
    :math:`\\mathrm{sign}(\\Delta r_\\mathrm{proxy}) = \\mathrm{sign}(\\Delta r_\\mathrm{gold})`.

    Parameters
    ----------
    task : ToyTask
    n : int
        Number of pairs, >= 1.
    generator : torch.Generator
        Draws the pairs.
    min_bangs : int
        In [0, T].
    """
    task = check_task(task)
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    T = task.space.length
    if isinstance(min_bangs, bool) or not isinstance(min_bangs, int) or not 0 <= min_bangs <= T:
        raise ValueError(f"min_bangs must be an int in [0, {T}] (a number of \"!\"), got {min_bangs!r}")
    logp = torch.where(task.bang_count >= min_bangs, task.ref_logprobs, -torch.inf)
    logp = logp - torch.logsumexp(logp, 0)
    a = ex.sample_sequences(logp, n, generator)
    b = ex.sample_sequences(logp, n, generator)
    dg = task.gold_reward[a] - task.gold_reward[b]
    dp = task.proxy_reward[a] - task.proxy_reward[b]
    keep = dg != 0
    return float((torch.sign(dg[keep]) == torch.sign(dp[keep])).to(_DTYPE).mean())
