"""Tests of kltutorial.monitoring and kltutorial.studies.diagnostics (book section 12): log statistics
and exact expectations, the samplers against their definitions, per-token KL tables against the chain rule,
spike detector on series whose spikes are known, and a table of bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial import exact as ex
from kltutorial import kl_estimate
from kltutorial import monitoring as mon
from kltutorial.studies import diagnostics as dg

F64 = torch.float64


def _random_table(space: ex.SequenceSpace, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(space.n_prefixes, space.vocab_size, generator=g, dtype=F64)
    return torch.log_softmax(logits, dim=-1)


SPACE = ex.SequenceSpace(vocab_size=3, length=3)
PI, REF, Q = (_random_table(SPACE, s) for s in (0, 1, 2))


# --- a log line -----------------------------------------------------------------------------------------


def test_kl_log_stats_by_hand():
    lp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0], [-3.0, -0.5]], dtype=F64)
    lq = torch.tensor([[-2.0, -1.0], [-1.5, -1.0], [-1.0, -0.5]], dtype=F64)
    s = mon.kl_log_stats(lp, lq)
    d = lp - lq  # per-sequence k1: 0, 0.5, -2
    k1 = d.sum(-1)
    k3 = (torch.exp(-d) - 1 + d).sum(-1)
    assert s.k1 == pytest.approx(-0.5) and s.k3 == pytest.approx(float(k3.mean()))
    assert s.k1_se == pytest.approx(float(k1.std()) / math.sqrt(3))
    assert s.gap == pytest.approx(s.k1 - s.k3)
    assert s.gap_se == pytest.approx(float((k1 - k3).std()) / math.sqrt(3))
    assert s.negative_sequences == pytest.approx(1 / 3)  # only the third sum is below 0
    assert s.negative_tokens == pytest.approx(2 / 6)  # -1 and -2
    assert s.max_sequence_k1 == pytest.approx(0.5) and s.n == 3


def test_kl_log_stats_uses_the_library_estimators_and_the_mask():
    g = torch.Generator().manual_seed(0)
    lp, lq = -torch.rand(4, 5, generator=g, dtype=F64), -torch.rand(4, 5, generator=g, dtype=F64)
    mask = torch.tensor([1, 1, 1, 0, 0])
    s = mon.kl_log_stats(lp, lq, mask)
    k3 = kl_estimate(lp, lq, "k3")[:, :3].sum(-1)
    assert s.k3 == pytest.approx(float(k3.mean()))
    assert s.k1 == pytest.approx(float((lp - lq)[:, :3].sum(-1).mean()))
    same = mon.kl_log_stats(lp, lq, mask.expand(4, 5))  # a (B, T) mask means the same
    assert same == s
    one = mon.kl_log_stats(lp[:1], lq[:1])
    assert math.isnan(one.k1_se) and math.isnan(one.gap_se)


def test_expected_log_stats_on_policy_is_the_exact_kl():
    logp = ex.sequence_logprobs(SPACE, PI)
    kl = ex.sequence_kl(logp, ex.sequence_logprobs(SPACE, REF))
    s = dg.expected_log_stats(SPACE, PI, REF)
    assert s.k1 == pytest.approx(kl, abs=1e-12) and s.k3 == pytest.approx(kl, abs=1e-12)
    assert s.gap == pytest.approx(0.0, abs=1e-12) and s.n is None and s.k1_se == 0.0


def test_expected_k1_under_another_sampler_is_a_difference_of_two_kls():
    lp, lr, lq = (ex.sequence_logprobs(SPACE, t) for t in (PI, REF, Q))
    s = dg.expected_log_stats(SPACE, PI, REF, sampler_table=Q)
    # E_q[log pi - log ref] = KL(q || ref) - KL(q || pi)
    assert s.k1 == pytest.approx(ex.sequence_kl(lq, lr) - ex.sequence_kl(lq, lp), abs=1e-12)
    off = dg.expected_log_stats(SPACE, PI, REF, sampler_table=REF)
    assert off.k1 == pytest.approx(-ex.sequence_kl(lr, lp), abs=1e-12) and off.k1 < 0


def test_expected_log_stats_is_the_mean_of_sampled_log_lines():
    mask = torch.tensor([0, 1, 1])
    exact = dg.expected_log_stats(SPACE, PI, REF, sampler_table=Q, mask=mask)
    idx = ex.sample_autoregressive(SPACE, Q, 200_000, torch.Generator().manual_seed(1))
    lp, lq = ex.token_logprobs(SPACE, PI)[idx], ex.token_logprobs(SPACE, REF)[idx]
    s = mon.kl_log_stats(lp, lq, mask)
    assert abs(s.k1 - exact.k1) < 4 * s.k1_se and abs(s.k3 - exact.k3) < 4 * s.k3_se
    assert abs(s.negative_sequences - exact.negative_sequences) < 0.005
    assert abs(s.negative_tokens - exact.negative_tokens) < 0.005


def test_expected_log_stats_shares_by_hand():
    space = ex.SequenceSpace(vocab_size=2, length=1)
    pi = torch.tensor([[0.5, 0.5]], dtype=F64).log()
    ref = torch.tensor([[0.25, 0.75]], dtype=F64).log()
    s = dg.expected_log_stats(space, pi, ref)  # token 1 has log(0.5 / 0.75) < 0, probability 0.5
    assert s.negative_sequences == pytest.approx(0.5) and s.negative_tokens == pytest.approx(0.5)
    assert s.max_sequence_k1 == pytest.approx(math.log(2))
    forced = dg.force_token_logprobs(pi, 1)  # a sampler that only draws token 1
    assert dg.expected_log_stats(space, pi, ref, forced).max_sequence_k1 == pytest.approx(math.log(2 / 3))


def test_entropy():
    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.3, 0.2, 0.0]], dtype=F64)
    h = mon.entropy(rows.log())
    p = rows[2, :3]
    torch.testing.assert_close(h, torch.tensor([math.log(4), 0.0, float(-(p * p.log()).sum())], dtype=F64))


# --- samplers -------------------------------------------------------------------------------------------

ROWS = torch.log_softmax(torch.randn(6, 7, generator=torch.Generator().manual_seed(3), dtype=F64), -1)


def _normalised(x: torch.Tensor) -> None:
    torch.testing.assert_close(torch.logsumexp(x, -1), torch.zeros(x.shape[:-1], dtype=x.dtype))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_top_k_keeps_the_k_most_likely_tokens(k):
    out = dg.top_k_logprobs(ROWS, k)
    _normalised(out)
    kept = torch.isfinite(out)
    assert (kept.sum(-1) == k).all()
    top = torch.topk(ROWS, k, dim=-1).indices
    assert kept.gather(-1, top).all()
    # on the kept tokens the ratios are the policy's: p(v) / sum of the kept p
    torch.testing.assert_close(out[kept], (ROWS - torch.logsumexp(ROWS.masked_fill(~kept, -math.inf), -1,
                                                                  keepdim=True))[kept])
    assert dg.top_k_logprobs(ROWS, 7) is ROWS


def test_top_k_keeps_ties():
    rows = torch.tensor([0.4, 0.3, 0.3], dtype=F64).log()
    torch.testing.assert_close(dg.top_k_logprobs(rows, 2).exp(), torch.tensor([0.4, 0.3, 0.3], dtype=F64))


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_smallest_nucleus(p):
    out = dg.top_p_logprobs(ROWS, p)
    _normalised(out)
    kept = torch.isfinite(out)
    probs = ROWS.exp()
    for row, keep in zip(probs, kept, strict=True):
        order = torch.argsort(row, descending=True)
        n = int(keep.sum())
        assert keep[order[:n]].all()  # the most likely tokens
        assert float(row[order[:n]].sum()) >= p  # with mass at least p
        assert n == 1 or float(row[order[: n - 1]].sum()) < p  # and no token fewer would do
    assert dg.top_p_logprobs(ROWS, 1.0) is ROWS


def test_temperature():
    out = dg.temperature_logprobs(ROWS, 0.5)
    torch.testing.assert_close(out, torch.log_softmax(2 * ROWS, -1))
    torch.testing.assert_close(dg.temperature_logprobs(ROWS, 1.0), ROWS)
    # a higher temperature flattens every row: its entropy rises
    assert (mon.entropy(dg.temperature_logprobs(ROWS, 2.0)) > mon.entropy(ROWS)).all()


def test_ban_and_force():
    out = dg.ban_token_logprobs(ROWS, 2)
    _normalised(out)
    assert torch.isneginf(out[:, 2]).all()
    torch.testing.assert_close(out[:, 0] - out[:, 1], ROWS[:, 0] - ROWS[:, 1])  # ratios kept
    forced = dg.force_token_logprobs(ROWS, 4)
    assert (forced[:, 4] == 0).all() and torch.isneginf(forced[:, [0, 1, 2, 3, 5, 6]]).all()


def test_at_positions_builds_a_minimum_length():
    banned = dg.at_positions(SPACE, PI, [0, 1], dg.ban_token_logprobs(PI, 0))
    logp = ex.sequence_logprobs(SPACE, banned)
    early_zero = (SPACE.sequences[:, :2] == 0).any(-1)
    assert torch.isneginf(logp[early_zero]).all() and torch.isfinite(logp[~early_zero]).all()
    # position 2 is the policy's: the last rows are unchanged
    o = SPACE.offsets
    torch.testing.assert_close(banned[o[2]:], PI[o[2]:])


# --- per-token KL ---------------------------------------------------------------------------------------


def test_token_kl_table_sums_to_the_kl_in_expectation():
    every = torch.arange(SPACE.n_sequences)
    table = dg.token_kl_table(SPACE, PI, REF, every)
    weights = ex.sequence_logprobs(SPACE, PI).exp()
    kl = ex.sequence_kl(ex.sequence_logprobs(SPACE, PI), ex.sequence_logprobs(SPACE, REF))
    # k1 sums to log pi(y) - log ref(y); its mean and the mean of the next-token KLs are both the KL
    assert float((weights * table.sequence_k1).sum()) == pytest.approx(kl, abs=1e-12)
    assert float((weights * table.sequence_kl).sum()) == pytest.approx(kl, abs=1e-12)
    assert (table.kl >= 0).all()  # a KL, unlike k1
    assert (table.k1 < 0).any()
    sorted_table = table.sorted()
    assert (sorted_table.sequence_k1[:-1] >= sorted_table.sequence_k1[1:]).all()
    assert torch.equal(torch.sort(sorted_table.tokens, dim=0).values, torch.sort(table.tokens, dim=0).values)


# --- spikes ---------------------------------------------------------------------------------------------


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return 1.0 + 0.05 * np.random.default_rng(seed).standard_normal(n)


def test_one_spike_is_flagged_and_nothing_else():
    x = _noise(120)
    x[70] += 1.0
    r = mon.detect_spikes(x, window=20, threshold=6.0)
    assert r.indices.tolist() == [70]
    assert np.isnan(r.score[:20]).all() and not r.flags[:20].any()


def test_median_and_mad_by_hand():
    x = [1.0, 2.0, 3.0, 4.0, 100.0, 0.0]
    r = mon.detect_spikes(x, window=5, threshold=1.0, side="both")
    # step 5: window 1, 2, 3, 4, 100 -> median 3, MAD = median(2, 1, 0, 1, 97) = 1
    assert r.median[5] == 3.0 and r.scale[5] == pytest.approx(mon.MAD_TO_STD)
    assert r.score[5] == pytest.approx(-3.0 / mon.MAD_TO_STD) and r.flags[5]


def test_a_spike_does_not_hide_the_next_one_unlike_mean_and_std():
    x = _noise(120, seed=1)
    x[[60, 66]] += 1.0
    robust = mon.detect_spikes(x, window=20, threshold=6.0)
    naive = mon.detect_spikes(x, window=20, threshold=6.0, centre="mean")
    assert robust.indices.tolist() == [60, 66]
    assert naive.indices.tolist() == [60]  # the first spike inflates the standard deviation


def test_detector_is_causal_and_two_sided_on_request():
    x = _noise(80, seed=2)
    x[50] -= 1.0
    assert mon.detect_spikes(x).indices.size == 0  # "upper" ignores a drop
    assert mon.detect_spikes(x, side="both").indices.tolist() == [50]
    y = x.copy()
    y[60:] = 50.0  # what happens later cannot change earlier flags
    before = mon.detect_spikes(x, side="both")
    after = mon.detect_spikes(y, side="both")
    np.testing.assert_array_equal(before.flags[:60], after.flags[:60])


def test_flat_history_uses_the_floor():
    x = np.ones(30)
    x[25] = 1.0 + 1e-12
    assert mon.detect_spikes(x, window=10).indices.size == 0  # below min_scale * threshold
    x[26] = 1.1
    assert mon.detect_spikes(x, window=10).indices.tolist() == [26]
    short = mon.detect_spikes(x[:5], window=10)
    assert np.isnan(short.median).all() and short.indices.size == 0


# --- bad input ------------------------------------------------------------------------------------------

LP = torch.zeros(2, 3)

BAD_INPUTS = [
    ("log-rank", lambda: mon.kl_log_stats(LP[0], LP[0]), ValueError, r"shape \(B, T\)"),
    ("log-shape", lambda: mon.kl_log_stats(LP, LP[:, :2]), ValueError, "same shape"),
    ("log-nan", lambda: mon.kl_log_stats(LP.clone().fill_(math.nan), LP), ValueError, "NaN"),
    ("log-mask", lambda: mon.kl_log_stats(LP, LP, torch.ones(4)), ValueError, "mask must have shape"),
    ("log-mask-values", lambda: mon.kl_log_stats(LP, LP, torch.full((3,), 0.5)), ValueError, "only 0 and 1"),
    ("exp-space", lambda: dg.expected_log_stats("space", PI, REF), TypeError, "SequenceSpace"),
    ("exp-table", lambda: dg.expected_log_stats(SPACE, PI[:3], REF), ValueError, "table must have shape"),
    ("exp-unnormalised", lambda: dg.expected_log_stats(SPACE, PI + 1, REF), ValueError, "logsumexp"),
    ("exp-support", lambda: dg.expected_log_stats(
        SPACE, dg.force_token_logprobs(PI, 0), REF, sampler_table=PI), ValueError, "cannot produce"),
    ("entropy-type", lambda: mon.entropy([0.0]), TypeError, "torch.Tensor"),
    ("top-k-zero", lambda: dg.top_k_logprobs(ROWS, 0), ValueError, "k must be >= 1"),
    ("top-k-float", lambda: dg.top_k_logprobs(ROWS, 2.0), TypeError, "k must be an int"),
    ("top-p-zero", lambda: dg.top_p_logprobs(ROWS, 0.0), ValueError, "p must be a finite number > 0"),
    ("top-p-big", lambda: dg.top_p_logprobs(ROWS, 1.5), ValueError, r"p must lie in \(0, 1\]"),
    ("temperature", lambda: dg.temperature_logprobs(ROWS, -1.0), ValueError, "temperature"),
    ("ban-token", lambda: dg.ban_token_logprobs(ROWS, 7), ValueError, r"token must be an int in \[0, 7\)"),
    ("ban-all", lambda: dg.ban_token_logprobs(dg.force_token_logprobs(ROWS, 1), 1), ValueError,
     "all its mass"),
    ("force-bool", lambda: dg.force_token_logprobs(ROWS, True), ValueError, "token must be an int"),
    ("at-position", lambda: dg.at_positions(SPACE, PI, [3], REF), ValueError, r"positions must be ints"),
    ("at-shape", lambda: dg.at_positions(SPACE, PI, [0], REF[:2]), ValueError, "other must have shape"),
    ("table-indices", lambda: dg.token_kl_table(SPACE, PI, REF, torch.tensor([27])), ValueError,
     r"lie in \[0, 27\)"),
    ("table-index-type", lambda: dg.token_kl_table(SPACE, PI, REF, [0]), TypeError, "int64"),
    ("spike-nan", lambda: mon.detect_spikes([1.0, math.nan]), ValueError, "finite"),
    ("spike-2d", lambda: mon.detect_spikes(np.ones((2, 3))), ValueError, "1-d"),
    ("spike-window", lambda: mon.detect_spikes(np.ones(5), window=2), ValueError, "window must be >= 3"),
    ("spike-threshold", lambda: mon.detect_spikes(np.ones(5), threshold=0), ValueError, "threshold"),
    ("spike-side", lambda: mon.detect_spikes(np.ones(5), side="lower"), ValueError, "side must be one of"),
    ("spike-centre", lambda: mon.detect_spikes(np.ones(5), centre="mode"), ValueError, "centre must be one"),
]


@pytest.mark.parametrize(("call", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
