r"""Sampling responses with a KV cache, their logits under two models, and the exact KL at every word.

A response is sampled after the prompt ``<s>`` (unconditional: the model writes a quote of its own), one
token at a time from the softmax of the policy's logits (temperature 1: the policy's own distribution,
so that k1 and k3 estimate its KL), reusing the key-value cache of the tokens before. The end token
``</s>`` is an action like any word: it is sampled, scored and penalised; the positions after it are
padding, masked out of every sum. A response that has not ended after ``max_new_tokens`` tokens is cut
there.

Shapes: B responses, T = ``max_new_tokens`` positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .._validation import check_generator, check_positive_int
from ..logprobs import exact_kl, get_logprobs_for_tokens

__all__ = ["Responses", "sample_responses", "response_logits", "decode_responses", "TokenKL", "token_kl",
           "PositionKL", "position_kl", "WordShift", "next_word_shift"]


@dataclass(frozen=True)
class Responses:
    """A batch of sampled responses.

    Attributes
    ----------
    tokens : Tensor, shape (B, T), int64
        Token ids; ``<pad>`` after a response's end token.
    mask : Tensor, shape (B, T), bool
        True at the response's actions: its words and marks and, where it ended, the end token.
    """

    tokens: torch.Tensor
    mask: torch.Tensor


def check_model(model: object, name: str) -> None:
    """Raise ``TypeError`` unless ``model`` (the argument ``name``) is a ``transformers`` model."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"{name} must be a transformers causal LM (e.g. from load_pretrained()), "
                        f"got {type(model).__name__}")


def check_tokenizer(tokenizer: object) -> None:
    """Raise ``TypeError`` unless ``tokenizer`` is a fast ``transformers`` tokenizer."""
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise TypeError(f"tokenizer must be a PreTrainedTokenizerFast (from load_pretrained()), "
                        f"got {type(tokenizer).__name__}")


def draw(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token from ``softmax(logits)`` per row, (B, V) -> (B,), by the inverse of the cumulative
    distribution: the first token whose cumulative probability (float64) exceeds a uniform draw. Exact,
    and three times faster than ``torch.multinomial`` over four thousand tokens."""
    cdf = torch.softmax(logits.double(), dim=-1).cumsum(-1)  # (B, V)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64, device=cdf.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


@torch.no_grad()
def sample_unchecked(model: PreTrainedModel, bos: int, eos: int, pad: int, n: int, max_new_tokens: int,
                     generator: torch.Generator) -> Responses:
    """:func:`sample_responses` for a caller that has checked its arguments."""
    device = next(model.parameters()).device
    tokens = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    out = model(input_ids=torch.full((n, 1), bos, dtype=torch.long, device=device), use_cache=True)
    length = max_new_tokens
    for t in range(max_new_tokens):
        y = draw(out.logits[:, -1], generator)  # (B,)
        tokens[:, t] = torch.where(done, pad, y)
        done |= y == eos
        if bool(done.all()):
            length = t + 1
            break
        if t + 1 < max_new_tokens:
            out = model(input_ids=tokens[:, t : t + 1], cache=out.cache, use_cache=True)
    tokens = tokens[:, :length]
    ends = (tokens == eos).long()
    mask = (ends.cumsum(-1) - ends) == 0  # up to and including the first end token
    return Responses(tokens=tokens, mask=mask)


def sample_responses(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, n: int,
                     max_new_tokens: int, *, generator: torch.Generator) -> Responses:
    """Sample ``n`` responses after ``<s>`` from ``model``'s softmax, with the KV cache.

    Parameters
    ----------
    model : transformers causal LM
    tokenizer : PreTrainedTokenizerFast
        Gives the ids of ``<s>``, ``</s>`` and ``<pad>``.
    n, max_new_tokens : int
        Responses, and the most tokens each may take (the end token included). The result has fewer
        columns when every response ended sooner.
    generator : torch.Generator
        Draws every token, e.g. ``torch.Generator().manual_seed(0)``.

    Returns
    -------
    Responses

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> model, tok = load_pretrained()
    >>> r = sample_responses(model, tok, 4, 24, generator=torch.Generator().manual_seed(0))
    >>> r.tokens.shape[0], bool(r.mask[:, 0].all())
    (4, True)
    """
    check_model(model, "model")
    check_tokenizer(tokenizer)
    n = check_positive_int(n, "n")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    check_generator(generator)
    return sample_unchecked(model, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                            n, max_new_tokens, generator)


def response_logits(model: PreTrainedModel, bos: int, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of the distribution each response token was drawn from: the model's output on
    ``<s> y_1 ... y_{T-1}`` (causal attention, so the padding after an end token changes no logit before
    it). Differentiable; float32."""
    inputs = torch.cat([torch.full_like(tokens[:, :1], bos), tokens[:, :-1]], dim=1)  # (B, T)
    return model(input_ids=inputs).logits.float()


def decode_responses(tokenizer: PreTrainedTokenizerFast, responses: Responses) -> list[str]:
    """Each response as text: its tokens before the end token, ``<unk>`` kept visible.

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> _, tok = load_pretrained()
    >>> ids = tok("many hands make light work.").input_ids + [tok.eos_token_id, tok.pad_token_id]
    >>> t = torch.tensor([ids])
    >>> decode_responses(tok, Responses(t, torch.ones_like(t, dtype=torch.bool)))
    ['many hands make light work.']
    """
    special = {tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id}
    texts = []
    for row, keep in zip(responses.tokens.tolist(), responses.mask.tolist(), strict=True):
        texts.append(tokenizer.decode([t for t, k in zip(row, keep, strict=True) if k and t not in special]))
    return texts


@dataclass(frozen=True)
class TokenKL:
    """One text's tokens and the exact KL at each.

    Attributes
    ----------
    tokens : tuple of str
        The text's tokens as the tokenizer names them (``##,`` is a comma), then ``</s>`` when the end
        was scored.
    kl : ndarray, shape (len(tokens),)
        :math:`\\mathrm{KL}(\\pi(\\cdot|y_{<t}) \\| \\pi_\\mathrm{ref}(\\cdot|y_{<t}))` in nats at the
        position of each token: the KL of the distribution that token was drawn from.
    k1 : ndarray, shape (len(tokens),)
        :math:`\\log\\pi(y_t|y_{<t}) - \\log\\pi_\\mathrm{ref}(y_t|y_{<t})`, the sampled log-ratio at the
        token itself (what a trainer logs): its mean over the token given the prefix is ``kl``.
    """

    tokens: tuple[str, ...]
    kl: np.ndarray
    k1: np.ndarray

    @property
    def total(self) -> float:
        """The sum along the text: the sequence KL's estimate (exact per position)."""
        return float(self.kl.sum())


_TOKEN_KL_BATCH = 128  # texts per forward pass in token_kl


@torch.no_grad()
def token_kl(policy: PreTrainedModel, reference: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
             texts: Sequence[str], *, end: bool = True) -> list[TokenKL]:
    r"""For each text, its tokens and the exact KL of the two models' next-token distributions at each.

    .. math:: \mathrm{KL}_t = \sum_{v=1}^{V} \pi(v|y_{<t})
              \log\frac{\pi(v|y_{<t})}{\pi_\mathrm{ref}(v|y_{<t})}

    over the whole vocabulary (:func:`kltutorial.logprobs.exact_kl`), at each position of
    ``<s> y_1 ... y_n`` (and ``</s>`` with ``end``): what the book's per-word KL heat maps show.

    Parameters
    ----------
    policy, reference : transformers causal LM
        The same vocabulary as ``tokenizer``.
    tokenizer : PreTrainedTokenizerFast
    texts : sequence of str
        Texts to score, e.g. the ``samples`` of :func:`~kltutorial.textrlhf.train_text`.
    end : bool
        Score the end token after each text too (the decision to stop), as the trainer does.

    Returns
    -------
    list of TokenKL
        One per text, in order.

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> model, tok = load_pretrained()
    >>> [r] = token_kl(model, model, tok, ["Many hands make light work."])
    >>> r.tokens, float(r.kl.max())
    (('many', 'hands', 'make', 'light', 'work', '##.', '</s>'), 0.0)
    """
    check_model(policy, "policy")
    check_model(reference, "reference")
    check_tokenizer(tokenizer)
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a sequence of str (a list of texts, not one str)")
    encoded = tokenizer(list(texts), add_special_tokens=False).input_ids
    rows = [ids + [tokenizer.eos_token_id] * bool(end) for ids in encoded]
    if not rows:
        return []
    if any(len(r) == 0 for r in rows):
        raise ValueError("a text of texts has no token and end=False: nothing to score")
    bos = tokenizer.bos_token_id
    out: list[TokenKL | None] = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # batches of similar length: less padding
    for start in range(0, len(order), _TOKEN_KL_BATCH):
        part = order[start : start + _TOKEN_KL_BATCH]
        T = max(len(rows[i]) for i in part)
        tokens = torch.full((len(part), T), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(part), T, dtype=torch.bool)
        for j, i in enumerate(part):
            tokens[j, : len(rows[i])] = torch.tensor(rows[i])
            mask[j, : len(rows[i])] = True
        lp, lq = response_logits(policy, bos, tokens), response_logits(reference, bos, tokens)
        kl = exact_kl(lp, lq, mask)
        k1 = get_logprobs_for_tokens(lp, tokens) - get_logprobs_for_tokens(lq, tokens)  # (B, T)
        for j, i in enumerate(part):
            n = len(rows[i])
            out[i] = TokenKL(tuple(tokenizer.convert_ids_to_tokens(rows[i])), kl[j, :n].numpy(),
                             k1[j, :n].numpy())
    return out


@dataclass(frozen=True)
class PositionKL:
    """Where along its own responses a policy's KL goes (:func:`position_kl`).

    Attributes
    ----------
    kl : ndarray, shape (T,)
        Each position's share of the sequence KL: the exact KL of the next-token distributions there,
        averaged over all the responses, a response that has ended counting 0. It sums to an unbiased
        estimate of :math:`\\mathrm{KL}(\\pi\\|\\pi_\\mathrm{ref})`.
    running : ndarray, shape (T,)
        The share of the responses still running at each position (their end token included).
    """

    kl: np.ndarray
    running: np.ndarray

    @property
    def per_running(self) -> np.ndarray:
        """The mean KL at each position over the responses still running there (NaN where none is)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.running > 0, self.kl / self.running, np.nan)


@torch.no_grad()
def position_kl(policy: PreTrainedModel, reference: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                n: int, max_new_tokens: int, *, generator: torch.Generator) -> PositionKL:
    r"""Where along its own responses the policy's KL goes: the exact KL of the two models' next-token
    distributions at each position of ``n`` responses sampled from ``policy``, averaged over the
    responses, a response that has ended counting 0.

    .. math:: \bar{\mathrm{KL}}_t = \frac{1}{n}\sum_{i=1}^{n} m_{it}\,
              \mathrm{KL}\big(\pi(\cdot|y^{(i)}_{<t}) \,\|\, \pi_\mathrm{ref}(\cdot|y^{(i)}_{<t})\big)

    with :math:`m_{it}` = 1 while response :math:`i` runs (its end token included). By the chain rule the
    profile sums to an unbiased estimate of the sequence KL :math:`\mathrm{KL}(\pi\|\pi_\mathrm{ref})`:
    each position's share of it.

    Returns
    -------
    PositionKL
        Zeros after the longest response's end.

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> model, tok = load_pretrained()
    >>> profile = position_kl(model, model, tok, 8, 24, generator=torch.Generator().manual_seed(0))
    >>> profile.kl.shape, float(profile.kl.sum()), float(profile.running[0])
    ((24,), 0.0, 1.0)
    """
    check_model(policy, "policy")
    check_model(reference, "reference")
    check_tokenizer(tokenizer)
    n = check_positive_int(n, "n")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    check_generator(generator)
    bos = tokenizer.bos_token_id
    total, running = np.zeros(max_new_tokens), np.zeros(max_new_tokens)
    for start in range(0, n, _TOKEN_KL_BATCH):
        r = sample_unchecked(policy, bos, tokenizer.eos_token_id, tokenizer.pad_token_id,
                             min(_TOKEN_KL_BATCH, n - start), max_new_tokens, generator)
        kl = exact_kl(response_logits(policy, bos, r.tokens), response_logits(reference, bos, r.tokens),
                      r.mask)  # (B, T), 0 after a response's end
        total[: kl.shape[1]] += kl.double().sum(0).numpy()
        running[: kl.shape[1]] += r.mask.sum(0).numpy()
    return PositionKL(kl=total / n, running=running / n)


@dataclass(frozen=True)
class WordShift:
    """One next word, its probability under the policy and under the reference."""

    word: str
    policy: float
    reference: float


@torch.no_grad()
def next_word_shift(policy: PreTrainedModel, reference: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                    prefix: str, *, top: int = 5) -> list[WordShift]:
    """The ``top`` next words whose probability the policy raised most over the reference's after
    ``<s>`` and ``prefix`` (``""``: the first word), largest rise first: where a position's KL comes from.

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> model, tok = load_pretrained()
    >>> [s.policy == s.reference for s in next_word_shift(model, model, tok, "many hands", top=2)]
    [True, True]
    """
    check_model(policy, "policy")
    check_model(reference, "reference")
    check_tokenizer(tokenizer)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str (\"\" for the first word), got {type(prefix).__name__}")
    top = check_positive_int(top, "top")
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(prefix, add_special_tokens=False).input_ids]])
    p = torch.softmax(policy(input_ids=ids).logits[0, -1].double(), -1)
    q = torch.softmax(reference(input_ids=ids).logits[0, -1].double(), -1)
    order = torch.argsort(p - q, descending=True)[:top].tolist()
    words = tokenizer.convert_ids_to_tokens(order)
    return [WordShift(w, float(p[i]), float(q[i])) for w, i in zip(words, order, strict=True)]
