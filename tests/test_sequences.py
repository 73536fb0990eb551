"""Tests of kltutorial.exact (book sections 3, 5, 11): exact maths on a sequence space small enough
to list, against closed forms, hand computations and properties (the chain rule, the optimum of the
KL-penalised objective, best-of-n, sampling frequencies)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from kltutorial import exact as ex

F64 = torch.float64


def _random_table(space: ex.SequenceSpace, seed: int, scale: float = 1.5) -> torch.Tensor:
    """A random autoregressive model: log-softmax of Gaussian logits, one row per prefix."""
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(space.n_prefixes, space.vocab_size, generator=g, dtype=F64)
    return torch.log_softmax(logits, dim=-1)


def _random_logprobs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(n, generator=g, dtype=F64), dim=0)


SPACES = [(2, 1), (2, 4), (3, 3), (5, 2), (1, 3)]


# --- the space ------------------------------------------------------------------------------


@pytest.mark.parametrize(("V", "T"), SPACES)
def test_space_lists_every_sequence_once_in_base_v(V: int, T: int) -> None:
    space = ex.SequenceSpace(V, T)
    assert space.sequences.shape == (V**T, T) and space.sequences.dtype == torch.int64
    assert torch.unique(space.sequences, dim=0).shape[0] == V**T == space.n_sequences
    for i, y in enumerate(space.sequences.tolist()):
        assert sum(tok * V ** (T - 1 - t) for t, tok in enumerate(y)) == i  # row i is i in base V
    # Rows of a table: all prefixes of length 0 .. T-1, i.e. 1 + V + ... + V**(T-1).
    assert space.n_prefixes == sum(V**k for k in range(T))
    assert space.offsets == tuple(sum(V**k for k in range(L)) for L in range(T + 1))


def test_prefix_ids_follow_the_prefix_tree() -> None:
    space = ex.SequenceSpace(3, 3)
    seen: dict[tuple[int, ...], int] = {}
    for y, rows in zip(space.sequences.tolist(), space.prefix_ids.tolist(), strict=True):
        for t in range(3):
            prefix = tuple(y[:t])
            code = sum(tok * 3 ** (t - 1 - s) for s, tok in enumerate(prefix))
            assert rows[t] == space.offsets[t] + code
            assert seen.setdefault(prefix, rows[t]) == rows[t]  # one row per prefix
    assert sorted(seen.values()) == list(range(space.n_prefixes))  # every row is some prefix


def test_space_is_frozen_and_compares_by_size() -> None:
    space = ex.SequenceSpace(vocab_size=2, length=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        space.length = 4  # type: ignore[misc]
    assert space == ex.SequenceSpace(2, 3) and hash(space) == hash(ex.SequenceSpace(2, 3))
    assert space != ex.SequenceSpace(3, 2)
    assert repr(space) == "SequenceSpace(vocab_size=2, length=3)"


# --- between tables and distributions -------------------------------------------------------


@pytest.mark.parametrize(("V", "T"), SPACES)
def test_sequence_logprobs_normalise_and_sum_the_token_logprobs(V: int, T: int) -> None:
    space = ex.SequenceSpace(V, T)
    table = _random_table(space, seed=V * 10 + T)
    logp = ex.sequence_logprobs(space, table)
    assert logp.shape == (V**T,) and logp.dtype == F64
    assert abs(float(torch.logsumexp(logp, 0))) < 1e-12
    tok = ex.token_logprobs(space, table)
    assert tok.shape == (V**T, T)
    torch.testing.assert_close(tok.sum(-1), logp, rtol=0, atol=1e-12)


def test_sequence_logprobs_by_hand() -> None:
    """Walk the prefix tree by hand for every sequence of V = 2, T = 3 and multiply the conditionals."""
    space = ex.SequenceSpace(2, 3)
    table = _random_table(space, seed=3)
    p = table.exp()
    rows = {(): 0, (0,): 1, (1,): 2, (0, 0): 3, (0, 1): 4, (1, 0): 5, (1, 1): 6}
    got = ex.sequence_logprobs(space, table).exp()
    for i, y in enumerate(itertools.product(range(2), repeat=3)):
        want = p[rows[()], y[0]] * p[rows[y[:1]], y[1]] * p[rows[y[:2]], y[2]]
        assert float(got[i]) == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize(("V", "T"), SPACES)
def test_next_token_logprobs_inverts_sequence_logprobs(V: int, T: int) -> None:
    space = ex.SequenceSpace(V, T)
    table = _random_table(space, seed=V + T)
    back = ex.next_token_logprobs(space, ex.sequence_logprobs(space, table))
    torch.testing.assert_close(back, table, rtol=0, atol=1e-10)


def test_next_token_logprobs_with_impossible_prefixes() -> None:
    """A token that is impossible makes its subtree impossible: those rows become uniform, and the
    distribution over sequences survives the round trip."""
    space = ex.SequenceSpace(2, 3)
    p = torch.tensor([[1.0, 0.0], [0.3, 0.7], [0.5, 0.5], [0.6, 0.4], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]],
                     dtype=F64)
    logp = ex.sequence_logprobs(space, p.log())
    assert torch.isinf(logp[4:]).all()  # every sequence starting with 1
    back = ex.next_token_logprobs(space, logp)
    torch.testing.assert_close(back[:2].exp(), p[:2], rtol=0, atol=1e-12)
    torch.testing.assert_close(back[[2, 5, 6]].exp(), torch.full((3, 2), 0.5, dtype=F64))  # under "1"
    torch.testing.assert_close(ex.sequence_logprobs(space, back), logp)


# --- KL and the chain rule ------------------------------------------------------------------


def test_sequence_kl_closed_forms() -> None:
    p = torch.tensor([0.5, 0.5], dtype=F64).log()
    q = torch.tensor([0.25, 0.75], dtype=F64).log()
    assert ex.sequence_kl(p, q) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-15)
    assert ex.sequence_kl(q, p) == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-15)
    assert ex.sequence_kl(p, p) == 0.0
    # 0 log 0 = 0 where p has no mass; +inf where p has mass and q none.
    point = torch.tensor([0.0, -torch.inf], dtype=F64)
    assert ex.sequence_kl(point, p) == pytest.approx(math.log(2), abs=1e-15)
    assert ex.sequence_kl(p, point) == math.inf


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 4, 0), (3, 3, 1), (5, 2, 2), (4, 4, 3), (2, 6, 4)])
def test_chain_rule_on_random_models(V: int, T: int, seed: int) -> None:
    """KL of the sequences = the sum over positions of the expected KL of the next-token distributions."""
    space = ex.SequenceSpace(V, T)
    pi, ref = _random_table(space, seed), _random_table(space, seed + 100)
    per_pos = ex.per_position_kl(space, pi, ref)
    assert per_pos.shape == (T,) and torch.all(per_pos >= 0)
    kl = ex.sequence_kl(ex.sequence_logprobs(space, pi), ex.sequence_logprobs(space, ref))
    assert float(per_pos.sum()) == pytest.approx(kl, rel=1e-10)
    # Each term, the other way round: E_{y ~ pi}[log pi(y_t | y_<t) - log ref(y_t | y_<t)].
    weight = ex.sequence_logprobs(space, pi).exp()[:, None]
    direct = (weight * (ex.token_logprobs(space, pi) - ex.token_logprobs(space, ref))).sum(0)
    torch.testing.assert_close(per_pos, direct, rtol=1e-10, atol=1e-14)


def test_per_position_kl_of_one_changed_row() -> None:
    """Change the policy at one prefix h of length 2 only: the KL sits at t = 2 and equals pi(h) KL(row)."""
    space = ex.SequenceSpace(3, 3)
    ref = _random_table(space, seed=7)
    pi = ref.clone()
    h = space.offsets[2] + 5  # the prefix "12"
    pi[h] = torch.tensor([0.1, 0.1, 0.8], dtype=F64).log()
    per_pos = ex.per_position_kl(space, pi, ref)
    p_h = float(ref[0, 1].exp() * ref[space.offsets[1] + 1, 2].exp())  # pi(y_0 = 1) pi(y_1 = 2 | 1)
    row_kl = float((pi[h].exp() * (pi[h] - ref[h])).sum())
    torch.testing.assert_close(per_pos, torch.tensor([0.0, 0.0, p_h * row_kl], dtype=F64), rtol=1e-12,
                               atol=1e-15)


def test_expected_reward_of_an_indicator_is_a_probability() -> None:
    space = ex.SequenceSpace(2, 3)
    logp = ex.sequence_logprobs(space, _random_table(space, seed=1))
    first_is_one = (space.sequences[:, 0] == 1).to(F64)
    p_table = _random_table(space, seed=1)[0, 1].exp()
    assert ex.expected_reward(logp, first_is_one) == pytest.approx(float(p_table), rel=1e-12)
    assert ex.expected_reward(logp, torch.ones(8, dtype=F64)) == pytest.approx(1.0, rel=1e-12)


# --- the optimum pi*_beta ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref_and_reward() -> tuple[torch.Tensor, torch.Tensor]:
    space = ex.SequenceSpace(3, 4)
    ref = ex.sequence_logprobs(space, _random_table(space, seed=11))
    reward = torch.randn(space.n_sequences, generator=torch.Generator().manual_seed(12), dtype=F64)
    return ref, reward


@pytest.mark.parametrize("beta", [0.05, 0.3, 1.0, 5.0])
def test_optimal_policy_closed_forms(ref_and_reward, beta: float) -> None:
    ref, r = ref_and_reward
    opt = ex.optimal_policy(ref, r, beta)
    assert abs(float(torch.logsumexp(opt, 0))) < 1e-12
    log_z = float(torch.logsumexp(ref + r / beta, 0))
    kl, reward = ex.sequence_kl(opt, ref), ex.expected_reward(opt, r)
    assert kl == pytest.approx(reward / beta - log_z, abs=1e-10)  # KL(pi* || ref) = E*[r] / beta - log Z
    # For any pi: J(pi*) - J(pi) = beta KL(pi || pi*), with J = E[r] - beta KL(. || ref).
    j_opt = reward - beta * kl
    for seed in range(5):
        other = _random_logprobs(ref.shape[0], seed)
        j = ex.expected_reward(other, r) - beta * ex.sequence_kl(other, ref)
        assert j_opt - j == pytest.approx(beta * ex.sequence_kl(other, opt), rel=1e-9)


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_optimal_policy_beats_random_perturbations(ref_and_reward, beta: float) -> None:
    ref, r = ref_and_reward
    opt = ex.optimal_policy(ref, r, beta)
    j_opt = ex.expected_reward(opt, r) - beta * ex.sequence_kl(opt, ref)
    g = torch.Generator().manual_seed(0)
    for size in (1e-3, 1e-1, 1.0):
        for _ in range(10):
            noisy = torch.log_softmax(opt + size * torch.randn(opt.shape, generator=g, dtype=F64), 0)
            assert ex.expected_reward(noisy, r) - beta * ex.sequence_kl(noisy, ref) < j_opt


def test_frontier_is_monotone_in_beta_and_reports_its_measures(ref_and_reward) -> None:
    ref, r = ref_and_reward
    betas = np.geomspace(20.0, 0.02, 25)
    other = torch.cos(torch.arange(ref.shape[0], dtype=F64))
    f = ex.optimal_frontier(ref, r, betas, measures={"other": other})
    assert f.betas.shape == f.kl.shape == f.reward.shape == f.measures["other"].shape == (25,)
    assert np.all(np.diff(f.kl) > 0) and np.all(np.diff(f.reward) > 0)  # beta falls: both rise
    for k in (0, 12, 24):
        opt = ex.optimal_policy(ref, r, float(betas[k]))
        assert f.kl[k] == pytest.approx(ex.sequence_kl(opt, ref), abs=1e-12)
        assert f.reward[k] == pytest.approx(ex.expected_reward(opt, r), abs=1e-12)
        assert f.measures["other"][k] == pytest.approx(ex.expected_reward(opt, other), abs=1e-12)


def test_optimal_policy_limits(ref_and_reward) -> None:
    ref, r = ref_and_reward
    assert ex.sequence_kl(ex.optimal_policy(ref, r, 1e8), ref) < 1e-12  # beta -> inf: pi_ref
    sharp = ex.optimal_policy(ref, r, 1e-6)  # beta -> 0: r / beta ~ 1e6, still finite in log space
    assert not torch.isnan(sharp).any()
    assert float(sharp[int(r.argmax())].exp()) == pytest.approx(1.0, abs=1e-12)
    assert ex.sequence_kl(sharp, ref) == pytest.approx(-float(ref[int(r.argmax())]), rel=1e-9)


# --- best-of-n ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_best_of_n_cdf_is_the_nth_power(ref_and_reward, n: int) -> None:
    ref, r = ref_and_reward
    r = torch.round(r * 2) / 2  # ties: about a dozen distinct values
    logp = ex.best_of_n_logprobs(ref, r, n)
    assert abs(float(torch.logsumexp(logp, 0))) < 1e-12
    values, group = torch.unique(r, return_inverse=True)
    assert values.shape[0] < 20
    mass = lambda lp: torch.zeros(len(values), dtype=F64).index_add_(0, group, lp.exp())  # noqa: E731
    torch.testing.assert_close(mass(logp).cumsum(0), mass(ref).cumsum(0).clamp(max=1) ** n, rtol=0,
                               atol=1e-12)
    # Within a group of equal rewards, the mass is split in proportion to pi_ref.
    ratio = (logp - ref).exp()
    for g in range(len(values)):
        in_group = ratio[group == g]
        torch.testing.assert_close(in_group, in_group[:1].expand_as(in_group))
    assert ex.sequence_kl(logp, ref) <= ex.best_of_n_kl_bound(n) + 1e-12
    if n == 1:
        torch.testing.assert_close(logp, ref, rtol=0, atol=1e-12)


def test_best_of_n_with_every_reward_tied_is_the_reference(ref_and_reward) -> None:
    ref, _ = ref_and_reward
    torch.testing.assert_close(ex.best_of_n_logprobs(ref, torch.zeros_like(ref), 50), ref, rtol=0,
                               atol=1e-12)


def test_best_of_n_never_picks_what_the_reference_never_draws() -> None:
    ref = torch.tensor([0.5, 0.5, 0.0], dtype=F64).log()
    logp = ex.best_of_n_logprobs(ref, torch.tensor([0.0, 1.0, 5.0], dtype=F64), 3)
    torch.testing.assert_close(logp.exp(), torch.tensor([0.125, 0.875, 0.0], dtype=F64))


def test_best_of_n_without_ties_approaches_the_formula() -> None:
    """Many equally likely sequences with distinct rewards: close to a continuous distribution."""
    n_seq = 8**5
    ref = torch.full((n_seq,), -math.log(n_seq), dtype=F64)
    r = torch.randperm(n_seq, generator=torch.Generator().manual_seed(0)).to(F64)
    for n in (2, 8, 64):
        kl = ex.sequence_kl(ex.best_of_n_logprobs(ref, r, n), ref)
        assert ex.best_of_n_kl_bound(n) - 0.01 < kl <= ex.best_of_n_kl_bound(n)


def test_best_of_n_kl_bound_values() -> None:
    assert ex.best_of_n_kl_bound(1) == 0.0
    assert ex.best_of_n_kl_bound(2) == pytest.approx(math.log(2) - 0.5)
    ns = 2 ** np.arange(5)
    np.testing.assert_allclose(ex.best_of_n_kl_bound(ns), np.log(ns) - (ns - 1) / ns)


# --- sampling -------------------------------------------------------------------------------


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of observed counts against exact probabilities."""
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _chi_square_quantile(p: float, dof: int) -> float:
    """The p-quantile of chi-square(dof), Wilson-Hilferty's approximation (within 1 % here)."""
    z = NormalDist().inv_cdf(p)
    c = 2 / (9 * dof)
    return dof * (1 - c + z * math.sqrt(c)) ** 3


@pytest.mark.parametrize("sampler", ["autoregressive", "sequences"])
def test_sampling_frequencies_match_the_exact_probabilities(sampler: str) -> None:
    space = ex.SequenceSpace(3, 3)
    table = _random_table(space, seed=5, scale=0.7)
    logp = ex.sequence_logprobs(space, table)
    g = torch.Generator().manual_seed(0)
    n = 200_000
    if sampler == "autoregressive":
        idx = ex.sample_autoregressive(space, table, n, g)
    else:
        idx = ex.sample_sequences(logp, n, g)
    assert idx.shape == (n,) and idx.dtype == torch.int64
    counts = torch.bincount(idx, minlength=space.n_sequences).to(F64)
    # Pearson's statistic has 26 degrees of freedom; a correct sampler exceeds this 1 time in 10**6.
    assert _chi_square(counts, logp.exp()) < _chi_square_quantile(1 - 1e-6, space.n_sequences - 1)


def test_samplers_detect_a_wrong_distribution() -> None:
    """The chi-square bound above has power: the same counts fail against another model."""
    space = ex.SequenceSpace(3, 3)
    table = _random_table(space, 5, 0.7)
    idx = ex.sample_autoregressive(space, table, 200_000, torch.Generator().manual_seed(0))
    counts = torch.bincount(idx, minlength=27).to(F64)
    other = ex.sequence_logprobs(space, _random_table(space, 6, 0.7)).exp()
    assert _chi_square(counts, other) > _chi_square_quantile(1 - 1e-6, 26)


def test_sampling_uses_only_the_callers_generator() -> None:
    space = ex.SequenceSpace(2, 3)
    table = _random_table(space, seed=0)
    torch.manual_seed(123)
    global_state = torch.get_rng_state()
    a = ex.sample_autoregressive(space, table, 50, torch.Generator().manual_seed(4))
    b = ex.sample_autoregressive(space, table, 50, torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), global_state)  # the global generator is untouched
    g = torch.Generator().manual_seed(4)
    first = ex.sample_sequences(ex.sequence_logprobs(space, table), 50, g)
    second = ex.sample_sequences(ex.sequence_logprobs(space, table), 50, g)
    assert not torch.equal(first, second)  # the generator's state moved on


# --- bad input ------------------------------------------------------------------------------

_S = ex.SequenceSpace(2, 2)
_T = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]], dtype=F64).log()
_P = torch.tensor([0.4, 0.1, 0.1, 0.4], dtype=F64).log()
_R = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=F64)
_G = torch.Generator()


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: ex.SequenceSpace(0, 3), ValueError, "vocab_size"),
        (lambda: ex.SequenceSpace(2, 1.5), TypeError, "length"),
        (lambda: ex.SequenceSpace(8, 8), ValueError, "at most 4,194,304"),
        (lambda: ex.sequence_logprobs("space", _T), TypeError, "space must be a SequenceSpace"),
        (lambda: ex.sequence_logprobs(_S, _T[:2]), ValueError, r"table must have shape \(3, 2\)"),
        (lambda: ex.sequence_logprobs(_S, _T.exp()), ValueError, "log_softmax"),
        (lambda: ex.sequence_logprobs(_S, _T.long()), TypeError, "table"),
        (lambda: ex.token_logprobs(_S, torch.full((3, 2), torch.nan, dtype=F64)), ValueError, "NaN"),
        (lambda: ex.next_token_logprobs(_S, _P[:3]), ValueError, r"logprobs must have shape \(4,\)"),
        (lambda: ex.sequence_kl(_P, _P + 1.0), ValueError, "logq - torch.logsumexp"),
        (lambda: ex.sequence_kl(_P, _P[:2] - math.log(0.5)), ValueError, "logq must have shape"),
        (lambda: ex.sequence_kl(_P.tolist(), _P), TypeError, "logp"),
        (lambda: ex.per_position_kl(_S, _T, _T[:, :1]), ValueError, "ref_table"),
        (lambda: ex.expected_reward(_P, _R[:3]), ValueError, "reward must have shape"),
        (lambda: ex.expected_reward(_P, _R.clone().fill_(torch.inf)), ValueError, "reward"),
        (lambda: ex.optimal_policy(_P, _R, 0.0), ValueError, "beta"),
        (lambda: ex.optimal_policy(_P, _R, "1"), TypeError, "beta"),
        (lambda: ex.optimal_frontier(_P, _R, []), ValueError, "betas"),
        (lambda: ex.optimal_frontier(_P, _R, [1.0, -1.0]), ValueError, "betas"),
        (lambda: ex.optimal_frontier(_P, _R, [1.0], {"x": _R[:2]}), ValueError, r"measures\['x'\]"),
        (lambda: ex.best_of_n_logprobs(_P, _R, 0), ValueError, "n must be >= 1"),
        (lambda: ex.best_of_n_kl_bound(0), ValueError, "n must be >= 1"),
        (lambda: ex.best_of_n_kl_bound(2.5), TypeError, "n must be an int"),
        (lambda: ex.sample_sequences(_P, 0, _G), ValueError, "n"),
        (lambda: ex.sample_sequences(_P, 3, 0), TypeError, "generator must be a torch.Generator"),
        (lambda: ex.sample_autoregressive(_S, _T, 3, np.random.default_rng()), TypeError, "generator"),
    ],
)
def test_bad_input_is_named(call, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
