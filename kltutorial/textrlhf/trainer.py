r"""REINFORCE with the KL penalty in the reward, on real text (the book's real-text chapter).

The run of book section 11 with a language model: the policy starts as a copy of the base model, which
stays frozen as the reference :math:`\pi_\mathrm{ref}`; each step samples B responses, scores them with
the gold reward (VADER) or the learned proxy, and follows the gradient of

.. math:: J(\theta) = \mathbb{E}_{y\sim\pi_\theta}\big[r(y)\big]
          - \beta\,\mathrm{KL}(\pi_\theta\|\pi_\mathrm{ref})

with the sequence's k1 (its log-ratio) in the reward, through the library's own
:func:`kltutorial.compute_rlhf_objective` (REINFORCE, leave-one-out baseline: the recipe of RLOO).
What each step records comes from the same batch: the gold and proxy rewards, the exact KL at every
sampled position summed along the response (:func:`kltutorial.exact_kl`, through the objective's
``info``), the k1 and k3 estimates (:func:`kltutorial.compute_token_kl`), distinct-1 and distinct-2 and
the length.

Shapes: B responses, T positions, V vocabulary.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .._validation import check_generator, check_positive_int
from ..estimators import compute_token_kl
from ..logprobs import exact_kl, get_logprobs_for_tokens
from ..objective import compute_rlhf_objective
from .config import TextTrainConfig
from .generation import (
    Responses,
    check_model,
    check_tokenizer,
    decode_responses,
    response_logits,
    sample_unchecked,
)
from .metrics import distinct_n
from .proxy import load_proxy_reward
from .reward import gold_reward

__all__ = ["REWARDS", "BatchStats", "TextTrainResult", "train_text", "evaluate_policy"]

#: The rewards a run can be trained on: the gold (VADER) or the learned Bradley–Terry proxy
#: (:func:`~kltutorial.textrlhf.load_proxy_reward`). Each step records both.
REWARDS: tuple[str, ...] = ("gold", "proxy")


@dataclass(frozen=True)
class BatchStats:
    """What one batch of responses measures (each a batch mean, per response).

    Attributes
    ----------
    gold : float
        The gold reward, VADER's compound score (:func:`~kltutorial.textrlhf.gold_reward`).
    proxy : float
        The learned proxy reward (:func:`~kltutorial.textrlhf.load_proxy_reward`), whichever the run
        trains on.
    kl : float
        :math:`\\sum_t \\mathrm{KL}_t`, the exact KL of the two models' next-token distributions at each
        sampled position, summed along the response (end token included): an unbiased, low-variance
        estimate of the sequence KL, in nats.
    k1, k3 : float
        The sampled estimates, summed along the response: :math:`\\sum_t \\log(\\pi/\\pi_\\mathrm{ref})`
        (what the reward's penalty uses) and :math:`\\sum_t (r_t - 1 - \\log r_t)`,
        :math:`r_t = \\pi_\\mathrm{ref}/\\pi`.
    distinct_1, distinct_2 : float
        :func:`~kltutorial.textrlhf.metrics.distinct_n` over the batch's words. It falls as a batch grows
        (more responses, more repeated pairs): compare it at one batch size, the book's 64.
    length : float
        Tokens (words and marks) before the end token.
    """

    gold: float
    proxy: float
    kl: float
    k1: float
    k3: float
    distinct_1: float
    distinct_2: float
    length: float


FIELDS: tuple[str, ...] = tuple(BatchStats.__dataclass_fields__)


def _stats(policy_logits: torch.Tensor, reference_logits: torch.Tensor, responses: Responses, eos: int,
           texts: Sequence[str], gold: torch.Tensor, proxy: torch.Tensor, kl: float) -> BatchStats:
    """The batch's :class:`BatchStats`; ``kl`` is the exact KL sum's batch mean, computed by the caller."""
    tokens, mask = responses.tokens, responses.mask
    lp = get_logprobs_for_tokens(policy_logits.detach(), tokens)  # (B, T)
    lq = get_logprobs_for_tokens(reference_logits.detach(), tokens)  # (B, T)
    _, k1 = compute_token_kl(lp, lq, mask, "k1", "sum")  # (B,)
    _, k3 = compute_token_kl(lp, lq, mask, "k3", "sum")  # (B,)
    length = mask.sum(-1) - (mask & (tokens == eos)).sum(-1)  # (B,): the end token is an action, not a word
    return BatchStats(
        gold=float(gold.mean()), proxy=float(proxy.mean()), kl=kl, k1=float(k1.mean()), k3=float(k3.mean()),
        distinct_1=distinct_n(texts, 1), distinct_2=distinct_n(texts, 2),
        length=float(length.double().mean()),
    )


@dataclass(frozen=True)
class TextTrainResult:
    """A real-text run: the trained policy, what every step measured, and the last samples.

    Each array has ``steps + 1`` entries: entry t measures the batch sampled at step t, from the policy
    after t updates; entry 0 is the base model itself (KL 0), the last one a batch from the final policy
    that trained nothing.

    Attributes
    ----------
    policy : transformers causal LM
        The trained policy (the model passed in is left as it was: it is the reference).
    config : TextTrainConfig
    reward : str
        The score the policy was trained on (``"gold"`` or ``"proxy"``).
    gold, proxy, kl, k1, k3, distinct_1, distinct_2, length : ndarray, shape (steps + 1,)
        Per step, as :class:`BatchStats` defines them.
    samples : tuple of str
        The last batch, decoded (``<unk>`` kept visible).
    seconds : float
        Wall-clock time of the run.
    """

    policy: PreTrainedModel
    config: TextTrainConfig
    reward: str
    gold: np.ndarray
    proxy: np.ndarray
    kl: np.ndarray
    k1: np.ndarray
    k3: np.ndarray
    distinct_1: np.ndarray
    distinct_2: np.ndarray
    length: np.ndarray
    samples: tuple[str, ...]
    seconds: float

    def final(self, last: int = 1) -> BatchStats:
        """The mean of each record over the last ``last`` entries (1: the final policy's batch)."""
        last = check_positive_int(last, "last")
        return BatchStats(*(float(np.mean(getattr(self, f)[-last:])) for f in FIELDS))


def _check_args(model: object, tokenizer: object, config: object, reward: object, generator: object) -> None:
    check_model(model, "model")
    check_tokenizer(tokenizer)
    if not isinstance(config, TextTrainConfig):
        raise TypeError(f"config must be a TextTrainConfig (e.g. TextTrainConfig(beta=0.05)), "
                        f"got {type(config).__name__}")
    if reward not in REWARDS:
        raise ValueError(f"reward must be 'gold' (VADER) or 'proxy' (the learned reward model), "
                         f"got {reward!r}")
    check_generator(generator)


def train_text(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, config: TextTrainConfig, *,
               reward: str = "gold", generator: torch.Generator) -> TextTrainResult:
    """Train a copy of ``model`` with REINFORCE on a reward minus β times the sequence's k1.

    Each step:

    1. sample B = ``config.batch_size`` responses after ``<s>`` from the policy, with the KV cache
       (:func:`~kltutorial.textrlhf.generation.sample_responses`); the end token is an action, the
       positions after it are masked;
    2. score the decoded responses with the gold reward (:func:`~kltutorial.textrlhf.gold_reward`) and
       the learned proxy (:func:`~kltutorial.textrlhf.load_proxy_reward`), and take ``reward``'s;
    3. the policy's and the reference's logits at every response position, and
       :func:`kltutorial.compute_rlhf_objective` with k1: the REINFORCE loss on
       :math:`r - \\beta \\sum_t \\log(\\pi/\\pi_\\mathrm{ref})` with the leave-one-out baseline, and the
       exact per-position KL summed along each response;
    4. record :class:`BatchStats`; one Adam step, the gradient's norm clipped to ``config.max_grad_norm``.

    After the last step, one more batch from the final policy is sampled and measured (and decoded into
    ``samples``), so the record ends with the policy the run returns.

    Parameters
    ----------
    model : transformers causal LM
        The base model, e.g. from :func:`~kltutorial.textrlhf.load_pretrained`. It is the reference and is
        not changed; the policy is a deep copy.
    tokenizer : PreTrainedTokenizerFast
    config : TextTrainConfig
    reward : {"gold", "proxy"}
        The score to train on: VADER itself, or the stored proxy learned from VADER's noisy comparisons
        (where over-optimisation shows: the proxy rises while the gold falls).
    generator : torch.Generator
        Draws every response, e.g. ``torch.Generator().manual_seed(0)``.

    Returns
    -------
    TextTrainResult

    Notes
    -----
    Runs are bit-identical on one machine with one thread (``torch.set_num_threads(1)``, as the command
    line sets); on another CPU the kernels round differently and a run drifts from the stored one.
    """
    _check_args(model, tokenizer, config, reward, generator)
    start = time.perf_counter()
    reference = model
    policy = copy.deepcopy(model)
    reference.requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    proxy = load_proxy_reward()
    records: list[BatchStats] = []
    texts: list[str] = []
    try:
        for step in range(config.steps + 1):
            # 1. sample; 2. score
            responses = sample_unchecked(policy, bos, eos, pad, config.batch_size, config.max_new_tokens,
                                         generator)
            texts = decode_responses(tokenizer, responses)
            gold, learned = gold_reward(texts), proxy(texts)  # (B,), (B,)
            scores = gold if reward == "gold" else learned
            # 3. both models' logits, the objective with k1 in the reward, the exact KL
            train = step < config.steps
            with torch.set_grad_enabled(train):
                policy_logits = response_logits(policy, bos, responses.tokens)  # (B, T, V)
            with torch.no_grad():
                reference_logits = response_logits(reference, bos, responses.tokens)  # (B, T, V)
            loss, info = compute_rlhf_objective(policy_logits, reference_logits, responses.tokens, scores,
                                                responses.mask, config.beta, estimator="k1")
            # 4. record, then update
            records.append(_stats(policy_logits, reference_logits, responses, eos, texts, gold, learned,
                                  info["mean_exact_kl"]))
            if train:
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
                opt.step()
    finally:
        reference.requires_grad_(True)
    policy.eval()
    columns = {f: np.array([getattr(r, f) for r in records]) for f in FIELDS}
    return TextTrainResult(policy=policy, config=config, reward=reward, samples=tuple(texts),
                           seconds=time.perf_counter() - start, **columns)


@torch.no_grad()
def evaluate_policy(policy: PreTrainedModel, reference: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                    *, n: int, max_new_tokens: int = TextTrainConfig.max_new_tokens,
                    generator: torch.Generator, batch_size: int = 64) -> tuple[BatchStats, list[str]]:
    """Sample ``n`` responses from ``policy`` and measure them as :func:`train_text` measures a batch.

    Parameters
    ----------
    policy, reference : transformers causal LM
        The reference's own measure is ``evaluate_policy(reference, reference, ...)`` (KL 0).
    tokenizer : PreTrainedTokenizerFast
    n : int
        Responses, sampled ``batch_size`` at a time.
    max_new_tokens : int
    generator : torch.Generator
    batch_size : int

    Returns
    -------
    (BatchStats, list of str)
        The measures (means over the ``n`` responses; distinct-n is counted within each batch of
        ``batch_size`` and averaged, as it falls when a sample grows) and the decoded responses.

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> model, tok = load_pretrained()
    >>> stats, texts = evaluate_policy(model, model, tok, n=8, generator=torch.Generator().manual_seed(0))
    >>> len(texts), stats.kl, stats.k1
    (8, 0.0, 0.0)
    """
    check_model(policy, "policy")
    check_model(reference, "reference")
    check_tokenizer(tokenizer)
    n = check_positive_int(n, "n")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    batch_size = check_positive_int(batch_size, "batch_size")
    check_generator(generator)
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    proxy = load_proxy_reward()
    parts, texts = [], []
    for start in range(0, n, batch_size):
        responses = sample_unchecked(policy, bos, eos, pad, min(batch_size, n - start), max_new_tokens,
                                     generator)
        batch_texts = decode_responses(tokenizer, responses)
        pl = response_logits(policy, bos, responses.tokens)
        rl = response_logits(reference, bos, responses.tokens)
        kl = exact_kl(pl, rl, responses.mask).sum(-1)  # (b,)
        stats = _stats(pl, rl, responses, eos, batch_texts, gold_reward(batch_texts), proxy(batch_texts),
                       float(kl.mean()))
        parts.append((len(batch_texts), stats))
        texts += batch_texts
    weights = np.array([w for w, _ in parts], dtype=float)
    mean = {f: float(np.average([getattr(s, f) for _, s in parts], weights=weights)) for f in FIELDS}
    return BatchStats(**mean), texts
