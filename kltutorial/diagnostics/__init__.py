r"""Diagnostics of the KL penalty: what to log, why an estimate goes negative, where the KL sits, spikes
(book section 12).

1. **A log line.** :func:`kl_log_stats` turns the per-token log-probs of a sampled batch into the numbers
   worth logging at every step: the batch means of the per-sequence k1 and k3 sums with their standard
   errors, the share of sequences and of tokens whose k1 is negative, and the largest sequence k1.
   :func:`expected_log_stats` gives the same numbers *exactly*, as sums over every sequence of a listable
   space (:mod:`kltutorial.sequences`), for sequences drawn from any sampler, and :func:`entropy` the
   entropy of next-token distributions.
2. **Samplers that are not the policy.** The sampled estimates are unbiased only for tokens drawn from the
   policy whose log-probs they use. Decoding settings change the distribution the tokens come from:
   :func:`top_k_logprobs`, :func:`top_p_logprobs` and :func:`temperature_logprobs` act on next-token rows
   as generation libraries do; :func:`ban_token_logprobs` (a minimum length bans the end token) and
   :func:`force_token_logprobs` (a forced end token) act at chosen positions through
   :func:`at_positions`.
3. **Where the KL sits.** :class:`TokenKLTable` holds, for sampled sequences, each token's k1 and the
   exact KL of the next-token distributions at its prefix; :func:`token_kl_table` builds it on a
   listable space.
4. **Spikes.** :func:`detect_spikes` flags the steps of a logged series that lie far above the rolling
   median of the steps before them, in units of their median absolute deviation (MAD).

Three modules, one idea each, imported from here: ``logs`` (items 1 and 3), ``samplers`` (item 2) and
``spikes`` (item 4).

Shapes: B batch (sequences), T positions, V vocabulary, P prefixes (rows of a next-token table),
V**T sequences, N steps of a log.
"""

from .logs import KLLogStats, TokenKLTable, entropy, expected_log_stats, kl_log_stats, token_kl_table
from .samplers import (
    at_positions,
    ban_token_logprobs,
    force_token_logprobs,
    temperature_logprobs,
    top_k_logprobs,
    top_p_logprobs,
)
from .spikes import MAD_TO_STD, SpikeReport, detect_spikes

__all__ = [
    "KLLogStats",
    "kl_log_stats",
    "expected_log_stats",
    "entropy",
    "top_k_logprobs",
    "top_p_logprobs",
    "temperature_logprobs",
    "ban_token_logprobs",
    "force_token_logprobs",
    "at_positions",
    "TokenKLTable",
    "token_kl_table",
    "SpikeReport",
    "detect_spikes",
    "MAD_TO_STD",
]
