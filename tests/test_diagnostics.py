"""Tests of kltutorial.studies.diagnostics (book section 12): the log line's exact expectations, the samplers
against their definitions, per-token KL tables against the chain rule, the false alarms of the k1 - k3 gap
against exact moments and the log line's own numbers (kltutorial.monitoring's, whose own tests are
tests/test_monitoring.py), and a table of bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial import exact as ex
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


# --- false alarms of the k1 - k3 gap ---------------------------------------------------------------------


def test_exact_kl_check_has_mean_zero_on_policy_and_not_off_it():
    every = dg.token_kl_table(SPACE, PI, REF, torch.arange(SPACE.n_sequences))
    w = ex.sequence_logprobs(SPACE, PI).exp()
    check = every.k1.sum(-1) - every.kl.sum(-1)  # (V**T,)
    assert float((w * check).sum()) == pytest.approx(0.0, abs=1e-12)
    q = ex.sequence_logprobs(SPACE, Q).exp()  # another sampler moves it
    assert abs(float((q * check).sum())) > 0.05


def _chi2_rows(p_rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
    """chi^2(q || p) of each row: sum_v q_v^2 / p_v - 1."""
    return (torch.exp(2 * q_rows - p_rows)).sum(-1) - 1


def test_gap_variance_is_the_chi2_of_the_next_token_distributions_summed():
    r = dg.gap_false_alarms(SPACE, PI, REF, 8, 3, torch.Generator().manual_seed(0))
    w = ex.sequence_logprobs(SPACE, PI).exp()
    per_position = _chi2_rows(PI, REF)[SPACE.prefix_ids].sum(-1)  # (V**T,)
    assert r.gap_variance == pytest.approx(float((w * per_position).sum()), rel=1e-10)
    kl = ex.sequence_kl(ex.sequence_logprobs(SPACE, PI), ex.sequence_logprobs(SPACE, REF))
    assert r.kl == pytest.approx(kl, abs=1e-12)
    # one position: chi^2(ref || pi) itself
    one = ex.SequenceSpace(vocab_size=4, length=1)
    pi, ref = dg.pushed_down_pair(4, 1, 2.0, torch.Generator().manual_seed(1))
    r1 = dg.gap_false_alarms(one, pi, ref, 8, 3, torch.Generator().manual_seed(0))
    assert r1.gap_variance == pytest.approx(float(_chi2_rows(pi, ref)[0]), rel=1e-10)


def test_each_batch_z_is_what_the_log_line_would_show():
    gen = torch.Generator().manual_seed(5)
    B, M = 16, 4
    r = dg.gap_false_alarms(SPACE, PI, REF, B, M, gen)
    idx = ex.sample_sequences(ex.sequence_logprobs(SPACE, PI), B * M, torch.Generator().manual_seed(5))
    every = dg.token_kl_table(SPACE, PI, REF, torch.arange(SPACE.n_sequences))
    lp, lq = ex.token_logprobs(SPACE, PI), ex.token_logprobs(SPACE, REF)
    for i in range(M):
        batch = idx[i * B:(i + 1) * B]
        s = mon.kl_log_stats(lp[batch], lq[batch])
        assert r.gap_z[i] == pytest.approx(s.gap / s.gap_se, rel=1e-9)
        mean, se = mon.exact_kl_check(lp[batch], lq[batch], every.kl[batch])
        assert r.check_z[i] == pytest.approx(mean / se, rel=1e-9)
    again = dg.gap_false_alarms(SPACE, PI, REF, B, M, torch.Generator().manual_seed(5))
    assert np.array_equal(again.gap_z, r.gap_z) and np.array_equal(again.check_z, r.check_z)


def test_close_pair_gives_gaussian_z_and_pushed_pair_false_alarms():
    one = ex.SequenceSpace(vocab_size=200, length=1)
    close = dg.pushed_down_pair(200, 5, 0.5, torch.Generator().manual_seed(2), noise=0.2)
    r = dg.gap_false_alarms(one, *close, 512, 2000, torch.Generator().manual_seed(3))
    assert r.gap_variance < 0.5
    for z in (r.gap_z, r.check_z):  # about standard normal: 2,000 batches
        assert abs(z.mean()) < 0.15 and 0.9 < z.std() < 1.1
    assert r.gap_rate == 0.0 and r.check_rate == 0.0
    assert r.gaussian_rate == pytest.approx(5.733e-7, rel=1e-3)
    assert abs(r.clamped_gap_mean) < 1e-12  # no k3 reaches 10: the clamp changes nothing
    pushed = dg.pushed_down_pair(200, 5, 8.0, torch.Generator().manual_seed(2), noise=0.2)
    f = dg.gap_false_alarms(one, *pushed, 512, 2000, torch.Generator().manual_seed(3))
    assert f.gap_variance > 100 and f.gap_rate > 0.2
    assert f.check_rate < 0.005  # the check stays close to Gaussian
    assert f.clamped_gap_mean > 0 and f.clamped_gap_z > 5  # the clamp biases the gap upwards


def test_pushed_down_pair_moves_only_the_favourites():
    pi, ref = dg.pushed_down_pair(50, 3, 4.0, torch.Generator().manual_seed(0), noise=0.0)
    assert pi.shape == ref.shape == (1, 50) and pi.dtype == F64
    shift = (pi - ref)[0]
    top = torch.topk(ref[0], 3).indices
    others = torch.ones(50, dtype=torch.bool)
    others[top] = False
    torch.testing.assert_close(shift[top], shift[others][:3] - 4.0)  # pushed by 4 nats, the rest alike
    assert torch.allclose(shift[others], shift[others][0].expand(47))


# --- bad input ------------------------------------------------------------------------------------------

GEN = torch.Generator().manual_seed(0)

BAD_INPUTS = [
    ("exp-space", lambda: dg.expected_log_stats("space", PI, REF), TypeError, "SequenceSpace"),
    ("exp-table", lambda: dg.expected_log_stats(SPACE, PI[:3], REF), ValueError, "table must have shape"),
    ("exp-unnormalised", lambda: dg.expected_log_stats(SPACE, PI + 1, REF), ValueError, "logsumexp"),
    ("exp-support", lambda: dg.expected_log_stats(
        SPACE, dg.force_token_logprobs(PI, 0), REF, sampler_table=PI), ValueError, "cannot produce"),
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
    ("alarm-space", lambda: dg.gap_false_alarms("space", PI, REF, 8, 2, GEN), TypeError, "SequenceSpace"),
    ("alarm-batch", lambda: dg.gap_false_alarms(SPACE, PI, REF, 1, 2, GEN), ValueError, "batch_size must be"),
    ("alarm-batches", lambda: dg.gap_false_alarms(SPACE, PI, REF, 8, 0, GEN), ValueError, "n_batches must"),
    ("alarm-threshold", lambda: dg.gap_false_alarms(SPACE, PI, REF, 8, 2, GEN, threshold=0.0), ValueError,
     "threshold must be"),
    ("alarm-clamp", lambda: dg.gap_false_alarms(SPACE, PI, REF, 8, 2, GEN, clamp=-1.0), ValueError,
     "clamp must be"),
    ("alarm-table", lambda: dg.gap_false_alarms(SPACE, PI[:3], REF, 8, 2, GEN), ValueError,
     "policy_table must have shape"),
    ("alarm-generator", lambda: dg.gap_false_alarms(SPACE, PI, REF, 8, 2, 0), TypeError, "generator must be"),
    ("alarm-support", lambda: dg.gap_false_alarms(SPACE, PI, dg.force_token_logprobs(REF, 0), 8, 2, GEN),
     ValueError, "reference cannot"),
    ("push-vocab", lambda: dg.pushed_down_pair(1, 1, 1.0, GEN), ValueError, "vocab_size must be >= 2"),
    ("push-count", lambda: dg.pushed_down_pair(5, 5, 1.0, GEN), ValueError, "n_pushed must be below"),
    ("push-negative", lambda: dg.pushed_down_pair(5, 1, -1.0, GEN), ValueError, "push must be"),
    ("push-noise", lambda: dg.pushed_down_pair(5, 1, 1.0, GEN, noise=-0.1), ValueError, "noise must be"),
]


@pytest.mark.parametrize(("call", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_split_vocabulary_checks_the_world_size_before_starting_processes():
    h, w = torch.zeros(2, 3), torch.zeros(4, 3)
    with pytest.raises(ValueError, match="world_size must be at most V = 4"):
        dg.split_vocabulary(h, w, torch.zeros(2, dtype=torch.long), h, w, world_size=5)
    with pytest.raises(ValueError, match="world_size"):
        dg.split_vocabulary(h, w, torch.zeros(2, dtype=torch.long), h, w, world_size=0)


def _store_then_abort(rank: int, world: int, folder: str, abort_rank: int, store_first: bool) -> None:
    """A process of spawn_ranks' tests: rank ``abort_rank`` aborts (SIGABRT) before storing its result, or
    after every rank has stored its own (as after the barrier that precedes a process group's teardown)."""
    import os
    import time

    if rank == abort_rank and not store_first:
        os.abort()
    dg.write_rank_result(folder, rank, {"rank": rank, "world": world})
    if rank == abort_rank:
        while not all(os.path.exists(os.path.join(folder, f"rank{r}.pkl")) for r in range(world)):
            time.sleep(0.01)
        os.abort()


def test_spawn_ranks_keeps_results_stored_before_a_crash_and_fails_on_one_before():
    """A process that aborts after storing its result (as torch's gloo teardown has) does not fail the call;
    one that aborts before storing it does."""
    assert dg.spawn_ranks(_store_then_abort, 2, (1, True), timeout=60) == [
        {"rank": 0, "world": 2}, {"rank": 1, "world": 2}]
    with pytest.raises(torch.multiprocessing.ProcessExitedException, match="SIGABRT"):
        dg.spawn_ranks(_store_then_abort, 2, (1, False), timeout=60)
    with pytest.raises(ValueError, match="world_size"):
        dg.spawn_ranks(_store_then_abort, 0, (0, True))
