"""Tests of kltutorial.monitoring (book section 12): the log line by hand (batches of 1, 2 and 3, an
all-padding mask, float32 input), k1 against the exact per-position KL, the entropy of any leading shape,
the spike detector's rolling statistics (a level shift, a spike, mean and standard deviation by hand, the
threshold's edge, its defaults), and a table of bad inputs. The same numbers computed exactly for a listed
space are tests/test_diagnostics.py's."""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np
import pytest
import torch

from kltutorial import kl_estimate
from kltutorial import monitoring as mon

F64 = torch.float64

# Three sequences of two tokens, log-probs written out: per-token log-ratios (1, -1), (0.5, 0), (-2, 0).
LP = torch.tensor([[-1.0, -2.0], [-1.0, -1.0], [-3.0, -0.5]], dtype=F64)
LQ = torch.tensor([[-2.0, -1.0], [-1.5, -1.0], [-1.0, -0.5]], dtype=F64)


def _k3(d: float) -> float:
    return math.exp(-d) - 1 + d


# --- the log line ----------------------------------------------------------------------------------------


def test_sequence_k1_k3_by_hand_in_float64_with_padding_that_would_overflow():
    d = torch.tensor([[0.5, -0.5, -1000.0], [2.0, 0.0, 0.0]], dtype=torch.float32)
    mask = torch.tensor([[True, True, False], [True, False, True]])  # k3 of the padded -1000 is inf
    k1, k3 = mon.sequence_k1_k3(d, mask)
    assert k1.dtype == k3.dtype == F64
    torch.testing.assert_close(k1, torch.tensor([0.0, 2.0], dtype=F64), rtol=0, atol=0)
    want = torch.tensor([_k3(0.5) + _k3(-0.5), _k3(2.0)], dtype=F64)
    torch.testing.assert_close(k3, want, rtol=1e-15, atol=0)
    # float64 throughout: 1e-9 survives next to 1 (float32 would round it away)
    tiny = torch.tensor([[1.0, 1e-9]], dtype=F64)
    assert float(mon.sequence_k1_k3(tiny, torch.ones(1, 2, dtype=torch.bool))[0][0]) == 1.0 + 1e-9


def test_kl_log_stats_by_hand():
    s = mon.kl_log_stats(LP, LQ)
    d = LP - LQ  # per-sequence k1: 0, 0.5, -2
    k1 = d.sum(-1)
    k3 = (torch.exp(-d) - 1 + d).sum(-1)
    assert s.k1 == pytest.approx(-0.5) and s.k3 == pytest.approx(float(k3.mean()))
    assert s.k1_se == pytest.approx(float(k1.std()) / math.sqrt(3))
    assert s.k3_se == pytest.approx(float(k3.std()) / math.sqrt(3))
    assert s.gap == pytest.approx(s.k1 - s.k3)
    assert s.gap_se == pytest.approx(float((k1 - k3).std()) / math.sqrt(3))
    assert s.negative_sequences == pytest.approx(1 / 3)  # only the third sum is below 0
    assert s.negative_tokens == pytest.approx(2 / 6)  # -1 and -2
    assert s.max_sequence_k1 == pytest.approx(0.5) and s.n == 3


def test_kl_log_stats_of_a_batch_of_two_has_standard_errors():
    # k1 sums 0 and 0.5: sample std |0.5| / sqrt(2), so se = 0.25; a number, not NaN
    s = mon.kl_log_stats(LP[:2], LQ[:2])
    assert s.n == 2 and s.k1 == pytest.approx(0.25) and s.k1_se == pytest.approx(0.25)
    k3 = [_k3(1.0) + _k3(-1.0), _k3(0.5)]
    assert s.k3_se == pytest.approx(abs(k3[0] - k3[1]) / 2)
    assert s.gap_se == pytest.approx(abs((0.0 - k3[0]) - (0.5 - k3[1])) / 2)
    assert s.max_sequence_k1 == pytest.approx(0.5)
    check = mon.exact_kl_check(LP[:2], LQ[:2], torch.zeros(2, 2, dtype=F64))
    assert check == (pytest.approx(0.25), pytest.approx(0.25))


def test_a_batch_of_one_has_nan_standard_errors_and_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no std() of one sample behind the NaN
        one = mon.kl_log_stats(LP[:1], LQ[:1])
        mean, se = mon.exact_kl_check(LP[:1], LQ[:1], torch.zeros(1, 2, dtype=F64))
    assert math.isnan(one.k1_se) and math.isnan(one.k3_se) and math.isnan(one.gap_se)
    assert one.k1 == 0.0 and one.n == 1 and mean == 0.0 and math.isnan(se)


@pytest.mark.parametrize("mask", [torch.zeros(2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.bool)])
def test_an_all_padding_mask_gives_zero_sums_and_nan_token_share(mask):
    s = mon.kl_log_stats(LP, LQ, mask)  # no ZeroDivisionError: there is no token to take a share of
    assert s.k1 == s.k3 == s.max_sequence_k1 == 0.0 and s.negative_sequences == 0.0
    assert math.isnan(s.negative_tokens)
    assert mon.exact_kl_check(LP, LQ, torch.ones(3, 2, dtype=F64), mask) == (0.0, 0.0)


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
    assert mon.kl_log_stats(lp, lq) == mon.kl_log_stats(lp, lq, torch.ones(4, 5))  # None: every position


def test_float32_log_probs_give_the_float64_numbers():
    s32 = mon.kl_log_stats(LP.float(), LQ.float())
    assert s32 == mon.kl_log_stats(LP, LQ)  # these log-probs are exact in float32
    kl = torch.tensor([[0.3, 0.1], [0.2, 0.0], [0.4, 0.2]])
    assert mon.exact_kl_check(LP.float(), LQ.float(), kl) == mon.exact_kl_check(LP, LQ, kl.double())


def test_exact_kl_check_by_hand_and_with_a_mask():
    kl = torch.tensor([[0.3, 0.1], [0.2, 0.0], [0.4, 0.2]], dtype=F64)
    d = (LP - LQ - kl).sum(-1)  # -0.4, 0.3, -2.6
    mean, se = mon.exact_kl_check(LP, LQ, kl)
    assert mean == pytest.approx(-0.9) and se == pytest.approx(float(d.std()) / math.sqrt(3))
    mask = torch.tensor([1, 0])
    assert mon.exact_kl_check(LP, LQ, kl, mask)[0] == pytest.approx(float((LP - LQ - kl)[:, 0].mean()))


def test_entropy():
    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.3, 0.2, 0.0]], dtype=F64)
    h = mon.entropy(rows.log())
    p = rows[2, :3]
    torch.testing.assert_close(h, torch.tensor([math.log(4), 0.0, float(-(p * p.log()).sum())], dtype=F64))


def test_entropy_of_any_leading_shape_sums_over_the_vocabulary_only():
    probs = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.25, 0.75]]] * 2, dtype=F64)  # (B, T, V) = (2, 3, 2)
    h = mon.entropy(probs.log())
    assert h.shape == (2, 3)
    row = torch.tensor([math.log(2), 0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], dtype=F64)
    torch.testing.assert_close(h, row.expand(2, 3))
    assert mon.entropy(torch.tensor([0.0, -math.inf])) == 0.0  # (V,): one distribution


# --- spikes ---------------------------------------------------------------------------------------------


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return 1.0 + 0.05 * np.random.default_rng(seed).standard_normal(n)


def test_one_spike_is_flagged_and_nothing_else():
    x = _noise(120)
    x[70] += 1.0
    r = mon.detect_spikes(x, window=20, threshold=6.0)
    assert r.indices.tolist() == [70]
    assert np.isnan(r.score[:20]).all() and not r.flags[:20].any()
    assert np.array_equal(r.values, x) and r.threshold == 6.0


def test_the_defaults_are_a_window_of_20_and_a_threshold_of_6():
    x = _noise(60, seed=4)
    x[40] += 1.0
    r = mon.detect_spikes(x)
    assert r.threshold == 6.0
    assert np.isnan(r.median[:20]).all() and not np.isnan(r.median[20:]).any()  # window 20
    assert r.median[20] == np.median(x[:20])
    assert r.indices.tolist() == [40]
    at_edge = mon.detect_spikes(x, threshold=float(r.score[40]))  # > threshold, not >=
    assert at_edge.indices.size == 0


def test_median_and_mad_by_hand():
    x = [1.0, 2.0, 3.0, 4.0, 100.0, 0.0]
    r = mon.detect_spikes(x, window=5, threshold=1.0, side="both")
    # step 5: window 1, 2, 3, 4, 100 -> median 3, MAD = median(2, 1, 0, 1, 97) = 1
    assert r.median[5] == 3.0 and r.scale[5] == pytest.approx(mon.MAD_TO_STD)
    assert r.score[5] == pytest.approx(-3.0 / mon.MAD_TO_STD) and r.flags[5]
    assert mon.MAD_TO_STD == pytest.approx(1 / statistics.NormalDist().inv_cdf(0.75), rel=1e-15)


def test_mean_and_standard_deviation_by_hand():
    x = [1.0, 2.0, 3.0, 6.0, 9.0]
    r = mon.detect_spikes(x, window=4, threshold=1.0, centre="mean")
    # step 4: window 1, 2, 3, 6 -> mean 3, sample standard deviation sqrt(14 / 3), score 6 / sqrt(14 / 3)
    assert r.median[4] == 3.0 and r.scale[4] == pytest.approx(math.sqrt(14 / 3), rel=1e-15)
    assert r.score[4] == pytest.approx(6 / math.sqrt(14 / 3), rel=1e-15)
    assert r.flags.tolist() == [False, False, False, False, True]


@pytest.mark.parametrize("centre", ["median", "mean"])
def test_the_statistics_roll_after_a_level_shift(centre):
    """A lasting change of level is flagged until about half the window has seen it (for the median), and
    the window's centre follows the new level: the statistics are those of the w steps before each step,
    not of the whole series."""
    w = 10
    x = np.concatenate([_noise(40, seed=5), 3.0 + _noise(40, seed=6)])  # from step 40 the level is 4
    r = mon.detect_spikes(x, window=w, threshold=6.0, centre=centre)
    past = np.lib.stride_tricks.sliding_window_view(x, w)[:-1]
    want = np.median(past, axis=1) if centre == "median" else past.mean(axis=1)
    np.testing.assert_allclose(r.median[w:], want, rtol=1e-15)
    assert abs(r.median[60] - 4.0) < 0.1 and abs(r.median[39] - 1.0) < 0.1
    if centre == "median":
        spread = 1.482602218505602 * np.median(np.abs(past - want[:, None]), axis=1)
        np.testing.assert_allclose(r.scale[w:], spread, rtol=1e-15)
        assert r.indices.min() == 40 and r.indices.max() <= 40 + w // 2  # then the median has moved
    else:
        np.testing.assert_allclose(r.scale[w:], past.std(axis=1, ddof=1), rtol=1e-15)
        assert r.indices.tolist() == [40]  # the shift inflates the standard deviation at once


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


@pytest.mark.parametrize(("side", "last"), [("upper", 2.0), ("both", 0.0)])
def test_a_score_equal_to_the_threshold_is_no_spike(side, last):
    # a flat history: the scale is min_scale = 0.5, so the last step scores exactly +2 or -2
    x = [1.0, 1.0, 1.0, last]
    assert mon.detect_spikes(x, window=3, threshold=2.0, min_scale=0.5, side=side).indices.size == 0
    assert mon.detect_spikes(x, window=3, threshold=1.99, min_scale=0.5, side=side).indices.tolist() == [3]


def test_flat_history_uses_the_floor():
    x = np.ones(30)
    x[25] = 1.0 + 1e-12
    assert mon.detect_spikes(x, window=10).indices.size == 0  # below min_scale * threshold
    x[26] = 1.1
    assert mon.detect_spikes(x, window=10).indices.tolist() == [26]
    short = mon.detect_spikes(x[:5], window=10)
    assert np.isnan(short.median).all() and short.indices.size == 0


def test_short_and_integer_series():
    one = mon.detect_spikes([3.0], window=3)  # one step, the smallest window: nothing to score yet
    assert one.flags.tolist() == [False] and np.isnan(one.score).all()
    r = mon.detect_spikes([1, 2, 3, 1, 9], window=3, threshold=4.0)  # ints are read as floats
    assert r.values.dtype == np.float64 and r.median.tolist()[3:] == [2.0, 2.0]
    assert r.indices.tolist() == [4] and r.score[4] == pytest.approx(7 / mon.MAD_TO_STD)


# --- bad input ------------------------------------------------------------------------------------------

Z = torch.zeros(2, 3)
NAN = torch.zeros(2, 3).fill_(math.nan)

BAD_INPUTS = [
    ("log-rank", lambda: mon.kl_log_stats(Z[0], Z[0]), ValueError,
     r"^policy_logprobs must have shape \(B, T\), got \(3,\)$"),
    ("log-shape", lambda: mon.kl_log_stats(Z, Z[:, :2]), ValueError, "same shape"),
    ("log-nan", lambda: mon.kl_log_stats(NAN, Z), ValueError, "^policy_logprobs contains NaN$"),
    ("log-nan-ref", lambda: mon.kl_log_stats(Z, NAN), ValueError, "^reference_logprobs contains NaN$"),
    ("log-mask", lambda: mon.kl_log_stats(Z, Z, torch.ones(4)), ValueError, "mask must have shape"),
    ("log-mask-values", lambda: mon.kl_log_stats(Z, Z, torch.full((3,), 0.5)), ValueError, "only 0 and 1"),
    ("check-rank", lambda: mon.exact_kl_check(Z[0], Z[0], Z[0]), ValueError,
     r"^policy_logprobs must have shape \(B, T\), got \(3,\)$"),
    ("check-nan", lambda: mon.exact_kl_check(NAN, Z, Z), ValueError, "^policy_logprobs contains NaN$"),
    ("check-nan-ref", lambda: mon.exact_kl_check(Z, NAN, Z), ValueError, "^reference_logprobs contains NaN$"),
    ("check-shape", lambda: mon.exact_kl_check(Z, Z, Z[:, :2]), ValueError,
     r"^position_kl must have the shape of the log-probs, \(2, 3\), one KL per sampled position; "
     r"got \(2, 2\)$"),
    ("check-kl-nan", lambda: mon.exact_kl_check(Z, Z, NAN), ValueError, "^position_kl contains NaN$"),
    ("entropy-type", lambda: mon.entropy([0.0]), TypeError, "^logprobs must be a torch.Tensor, got list$"),
    ("entropy-nan", lambda: mon.entropy(NAN), ValueError, "^logprobs contains NaN$"),
    ("entropy-posinf", lambda: mon.entropy(torch.tensor([0.0, math.inf])), ValueError,
     r"^logprobs contains \+inf"),
    ("spike-nan", lambda: mon.detect_spikes([1.0, math.nan]), ValueError,
     "^values must be a non-empty 1-d series of finite numbers$"),
    ("spike-empty", lambda: mon.detect_spikes([]), ValueError, "non-empty"),
    ("spike-2d", lambda: mon.detect_spikes(np.ones((2, 3))), ValueError, "1-d"),
    ("spike-window-zero", lambda: mon.detect_spikes(np.ones(5), window=0), ValueError,
     "^window must be >= 1, got 0$"),
    ("spike-window", lambda: mon.detect_spikes(np.ones(5), window=2), ValueError,
     "^window must be >= 3 past steps, got 2$"),
    ("spike-threshold", lambda: mon.detect_spikes(np.ones(5), threshold=0), ValueError,
     "^threshold must be a finite number > 0, got 0"),
    ("spike-min-scale", lambda: mon.detect_spikes(np.ones(5), min_scale=-1.0), ValueError,
     "^min_scale must be a finite number > 0, got -1"),
    ("spike-side", lambda: mon.detect_spikes(np.ones(5), side="lower"), ValueError, "side must be one of"),
    ("spike-centre", lambda: mon.detect_spikes(np.ones(5), centre="mode"), ValueError, "centre must be one"),
]


@pytest.mark.parametrize(("call", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
