"""Tests of kltutorial.exact (book sections 1 and 2): the KL divergence of categorical
distributions and of Gaussians, against closed forms and hand computations; its properties
(non-negativity, zero only at p = q, asymmetry, units); the forward fit (moment matching) and the reverse
fit (a mode) of one Gaussian to a mixture, checked as minima; and the optimum of a forward-KL penalty,
checked against its stationarity conditions and a brute-force search."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial import exact as ex

F64 = torch.float64


def _dirichlet_pairs(n: int, k: int, alpha: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(k, alpha), size=n), rng.dirichlet(np.full(k, alpha), size=n)


def _trapezoid_kl(p, q, lo: float = -25.0, hi: float = 25.0, n: int = 400_001) -> float:
    """KL(p || q) by the trapezoid rule on one fine grid in x: an implementation independent of the
    module's per-component grids."""
    x = np.linspace(lo, hi, n)
    lp, lq = p.logpdf(x), q.logpdf(x)
    f = np.exp(lp) * (lp - lq)
    return float(np.sum(0.5 * (f[1:] + f[:-1])) * (x[1] - x[0]))


# --- categorical: closed forms -----------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [(0.5, 0.25), (0.1, 0.9), (0.99, 0.5), (0.3, 0.3)])
def test_bernoulli_closed_form(a: float, b: float) -> None:
    want = a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))
    assert ex.kl_divergence([a, 1 - a], [b, 1 - b]) == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("k", [1, 2, 5, 64])
def test_entropy_of_uniform_and_point_mass(k: int) -> None:
    uniform = np.full(k, 1.0 / k)
    assert ex.entropy(uniform) == pytest.approx(math.log(k), abs=1e-12)
    assert ex.entropy(uniform, unit="bits") == pytest.approx(math.log2(k), abs=1e-12)
    point = np.eye(k)[0]
    assert ex.entropy(point) == 0.0  # 0 log 0 = 0
    # A point mass against the uniform distribution: KL = log k, the surprise of one outcome.
    assert ex.kl_divergence(point, uniform) == pytest.approx(math.log(k), abs=1e-12)


def test_units_one_bit_is_log_two_nats() -> None:
    assert ex.NATS_PER_BIT == math.log(2.0)
    p, q = _dirichlet_pairs(50, 6, 1.0, seed=0)
    np.testing.assert_allclose(ex.kl_divergence(p, q, unit="bits") * math.log(2.0), ex.kl_divergence(p, q),
                               rtol=1e-14)
    assert ex.kl_divergence([1.0, 0.0], [0.5, 0.5], unit="bits") == pytest.approx(1.0, abs=1e-15)


def test_cross_entropy_is_entropy_plus_kl() -> None:
    p, q = _dirichlet_pairs(200, 7, 0.5, seed=1)
    np.testing.assert_allclose(ex.cross_entropy(p, q), ex.entropy(p) + ex.kl_divergence(p, q), atol=1e-12)
    # KL(p || q) = -H(p) - E_p[log q], summed by hand for one pair
    want = (p[0] * np.log(p[0])).sum() - (p[0] * np.log(q[0])).sum()
    assert ex.kl_divergence(p[0], q[0]) == pytest.approx(want, abs=1e-12)


# --- categorical: properties ------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "alpha"), [(2, 1.0), (10, 1.0), (10, 0.05), (100, 0.3)])
def test_gibbs_inequality_on_random_pairs(k: int, alpha: float) -> None:
    p, q = _dirichlet_pairs(5000, k, alpha, seed=k)
    kl = ex.kl_divergence(p, q)
    assert kl.shape == (5000,)
    assert np.all(kl[np.isfinite(kl)] >= 0.0)  # never negative
    assert np.all(ex.kl_divergence(p, p) == 0.0)  # zero at p = q, exactly
    differ = np.abs(p - q).max(-1) > 1e-6
    assert np.all(kl[differ] > 0)  # and only there


def test_kl_is_not_symmetric() -> None:
    p, q = [0.8, 0.15, 0.05], [1 / 3, 1 / 3, 1 / 3]
    forward, reverse = ex.kl_divergence(p, q), ex.kl_divergence(q, p)
    assert forward == pytest.approx(math.log(3) - ex.entropy(p), abs=1e-15)
    assert abs(forward - reverse) > 0.1


def test_support_conventions() -> None:
    # q misses an outcome p can produce: infinite; p misses one q can produce: finite.
    assert ex.kl_divergence([0.5, 0.5, 0.0], [1.0, 0.0, 0.0]) == math.inf
    assert ex.kl_divergence([1.0, 0.0, 0.0], [0.5, 0.5, 0.0]) == pytest.approx(math.log(2), abs=1e-15)
    assert ex.cross_entropy([0.5, 0.5], [1.0, 0.0]) == math.inf
    with np.errstate(all="raise"):  # no warning is raised on the way
        ex.kl_divergence([0.5, 0.5, 0.0], [0.0, 0.5, 0.5])


def test_scalar_and_batch_returns() -> None:
    assert isinstance(ex.kl_divergence([0.5, 0.5], [0.25, 0.75]), float)
    p, q = _dirichlet_pairs(12, 4, 1.0, seed=2)
    out = ex.kl_divergence(p.reshape(3, 4, 4), q.reshape(3, 4, 4))
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out.reshape(-1), ex.kl_divergence(p, q))


# --- Gaussians ------------------------------------------------------------------------------


GAUSSIAN_PAIRS = [((0.0, 1.0), (1.0, 1.0)), ((0.0, 1.0), (0.0, 2.0)), ((-1.5, 0.3), (2.0, 1.7)),
                  ((3.0, 2.5), (-1.0, 0.4))]


@pytest.mark.parametrize(("a", "b"), GAUSSIAN_PAIRS)
def test_gaussian_closed_form_against_quadrature(a, b) -> None:
    p, q = ex.Gaussian(*a), ex.Gaussian(*b)
    want = math.log(b[1] / a[1]) + (a[1] ** 2 + (a[0] - b[0]) ** 2) / (2 * b[1] ** 2) - 0.5
    assert ex.kl_gaussians(p, q) == pytest.approx(want, abs=1e-14)
    assert ex.kl_quadrature(p, q) == pytest.approx(want, rel=1e-12, abs=1e-14)
    assert ex.kl_gaussians(p, p) == 0.0 and ex.kl_quadrature(p, p) == 0.0
    assert ex.kl_gaussians(p, q) > 0
    if a[1] != b[1]:  # symmetric only when the widths are equal
        assert ex.kl_gaussians(p, q) != pytest.approx(ex.kl_gaussians(q, p))
    else:
        assert ex.kl_gaussians(p, q) == pytest.approx(ex.kl_gaussians(q, p), abs=1e-15)


def test_gaussian_kl_is_invariant_under_shift_and_scale() -> None:
    p, q = ex.Gaussian(0.3, 0.8), ex.Gaussian(-1.0, 1.6)
    moved = ex.kl_gaussians(ex.Gaussian(2 * 0.3 + 5, 2 * 0.8), ex.Gaussian(2 * -1.0 + 5, 2 * 1.6))
    assert moved == pytest.approx(ex.kl_gaussians(p, q), abs=1e-14)


def test_gaussian_density_and_entropy() -> None:
    g = ex.Gaussian(1.0, 2.0)
    x = np.linspace(-30, 32, 200_001)
    assert float(np.trapezoid(g.pdf(x), x)) == pytest.approx(1.0, abs=1e-12)
    assert g.entropy == pytest.approx(float(-np.trapezoid(g.pdf(x) * g.logpdf(x), x)), abs=1e-10)


MIX = ex.GaussianMixture(weights=(0.6, 0.4), means=(-3.0, 2.0), stds=(1.0, 0.5))  # the mixture of §2


def test_mixture_density_and_moments() -> None:
    x = np.linspace(-20, 20, 400_001)
    dens = MIX.pdf(x)
    assert float(np.trapezoid(dens, x)) == pytest.approx(1.0, abs=1e-12)
    mean = float(np.trapezoid(x * dens, x))
    var = float(np.trapezoid((x - mean) ** 2 * dens, x))
    assert MIX.mean == pytest.approx(mean, abs=1e-10) and MIX.std == pytest.approx(math.sqrt(var), abs=1e-10)
    assert MIX.mean == pytest.approx(-1.0) and MIX.std**2 == pytest.approx(0.6 * 10 + 0.4 * 4.25 - 1)
    one = ex.GaussianMixture.of(ex.Gaussian(0.5, 1.5))
    np.testing.assert_allclose(one.logpdf(x[:100]), ex.Gaussian(0.5, 1.5).logpdf(x[:100]), rtol=1e-14)
    # A weight of 0 removes a component.
    dropped = ex.GaussianMixture((1.0, 0.0), (0.0, 5.0), (1.0, 1.0))
    np.testing.assert_allclose(dropped.logpdf(x[:100]), ex.Gaussian(0.0, 1.0).logpdf(x[:100]), rtol=1e-14)


@pytest.mark.parametrize(("p", "q"), [(MIX, ex.Gaussian(0.0, 1.0)), (ex.Gaussian(0.0, 1.0), MIX),
                                      (MIX, ex.GaussianMixture((0.3, 0.7), (-1.0, 1.5), (0.5, 1.2)))])
def test_quadrature_against_one_fine_grid(p, q) -> None:
    assert ex.kl_quadrature(p, q) == pytest.approx(_trapezoid_kl(p, q), abs=1e-9)


def test_forward_fit_matches_moments_and_is_the_minimum() -> None:
    fit = ex.fit_forward_kl(MIX)
    assert fit == ex.Gaussian(MIX.mean, MIX.std)
    best = ex.kl_quadrature(MIX, fit)
    for dm, ds in [(0.05, 0.0), (-0.05, 0.0), (0.0, 0.05), (0.0, -0.05), (0.1, 0.1)]:
        assert ex.kl_quadrature(MIX, ex.Gaussian(fit.mean + dm, fit.std + ds)) > best
    # The fit of a Gaussian is the Gaussian.
    assert ex.fit_forward_kl(ex.Gaussian(1.0, 3.0)) == ex.Gaussian(1.0, 3.0)


@pytest.mark.parametrize(("start", "component"), [(-4.0, 0), (-1.0, 0), (4.0, 1), (1.0, 1)])
def test_reverse_fit_finds_the_mode_near_its_start(start: float, component: int) -> None:
    fit = ex.fit_reverse_kl(MIX, ex.Gaussian(start, 1.0))
    assert abs(fit.mean - MIX.means[component]) < 0.05
    assert abs(fit.std - MIX.stds[component]) < 0.05
    kl = ex.kl_quadrature(fit, MIX)
    # q nearly equals the k-th component, so KL(q || p) is close to -log w_k.
    assert kl == pytest.approx(-math.log(MIX.weights[component]), abs=0.01)
    for dm, ds in [(0.01, 0.0), (-0.01, 0.0), (0.0, 0.01), (0.0, -0.01)]:  # a minimum
        assert ex.kl_quadrature(ex.Gaussian(fit.mean + dm, fit.std + ds), MIX) > kl
    # Mode-seeking against mass-covering: each direction prefers its own fit.
    forward = ex.fit_forward_kl(MIX)
    assert ex.kl_quadrature(MIX, forward) < ex.kl_quadrature(MIX, fit)
    assert kl < ex.kl_quadrature(forward, MIX)


def test_reverse_fit_of_a_gaussian_is_that_gaussian_and_deterministic() -> None:
    fit = ex.fit_reverse_kl(ex.Gaussian(1.0, 2.0), ex.Gaussian(-2.0, 0.5))
    assert fit.mean == pytest.approx(1.0, abs=1e-8) and fit.std == pytest.approx(2.0, abs=1e-8)
    a = ex.fit_reverse_kl(MIX, ex.Gaussian(-4.0, 1.0))
    assert a == ex.fit_reverse_kl(MIX, ex.Gaussian(-4.0, 1.0))  # bit for bit


def test_reverse_fit_stationary_by_finite_differences() -> None:
    fit = ex.fit_reverse_kl(MIX, ex.Gaussian(4.0, 1.0))
    h = 1e-5

    def kl(m: float, s: float) -> float:
        return ex.kl_quadrature(ex.Gaussian(m, s), MIX)

    d_mean = (kl(fit.mean + h, fit.std) - kl(fit.mean - h, fit.std)) / (2 * h)
    d_std = (kl(fit.mean, fit.std + h) - kl(fit.mean, fit.std - h)) / (2 * h)
    assert abs(d_mean) < 1e-6 and abs(d_std) < 1e-6


def test_profiles() -> None:
    means = np.linspace(-5.0, 4.0, 46)
    fwd, fwd_std = ex.kl_profile(MIX, means, "forward")
    np.testing.assert_allclose(fwd_std**2, MIX.std**2 + (means - MIX.mean) ** 2)
    assert means[np.argmin(fwd)] == pytest.approx(MIX.mean)  # one minimum, at the mean of p
    assert np.all(np.diff(fwd[means <= MIX.mean]) < 0) and np.all(np.diff(fwd[means >= MIX.mean]) > 0)
    rev, rev_std = ex.kl_profile(MIX, means, "reverse", n_stds=100)
    interior = np.flatnonzero((rev[1:-1] < rev[:-2]) & (rev[1:-1] < rev[2:])) + 1
    np.testing.assert_allclose(means[interior], [-3.0, 2.0], atol=0.11)  # one local minimum per mode
    assert means[np.argmin(rev)] == pytest.approx(-3.0, abs=0.11)  # the heavier mode is the global one
    # The profile is a minimum over widths: at the fitted mean it is no better than the fit, and close.
    fit = ex.fit_reverse_kl(MIX, ex.Gaussian(-4.0, 1.0))
    at_fit, _ = ex.kl_profile(MIX, [fit.mean], "reverse")
    assert ex.kl_quadrature(fit, MIX) <= at_fit[0] + 1e-12 and at_fit[0] - ex.kl_quadrature(fit, MIX) < 1e-3
    assert np.all(rev_std > 0)


# --- the optimum of a forward-KL penalty -----------------------------------------------------------


def _j_forward(logp: torch.Tensor, ref: torch.Tensor, r: torch.Tensor, beta: float) -> float:
    return ex.expected_reward(logp, r) - beta * ex.kl_divergence(ref.exp().numpy(), logp.exp().numpy())


def _j_reverse(logp: torch.Tensor, ref: torch.Tensor, r: torch.Tensor, beta: float) -> float:
    return ex.expected_reward(logp, r) - beta * ex.sequence_kl(logp, ref)


def test_forward_optimum_two_outcomes_closed_form() -> None:
    ref = torch.tensor([0.5, 0.5], dtype=F64).log()
    pi = ex.forward_kl_optimal_policy(ref, torch.tensor([0.0, 1.0], dtype=F64), 1.0).exp()
    lam = 1 + 1 / math.sqrt(2)  # 0.5 / lam + 0.5 / (lam - 1) = 1
    torch.testing.assert_close(pi, torch.tensor([0.5 / lam, 0.5 / (lam - 1)], dtype=F64), rtol=0, atol=1e-14)


@pytest.mark.parametrize("beta", [0.01, 0.1, 1.0, 10.0])
def test_forward_optimum_stationarity_and_brute_force(beta: float) -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.log_softmax(torch.randn(3, generator=g, dtype=F64), 0)
    r = torch.randn(3, generator=g, dtype=F64)
    logp = ex.forward_kl_optimal_policy(ref, r, beta)
    assert float(torch.logsumexp(logp, 0)) == pytest.approx(0.0, abs=1e-14)
    lam = r + beta * (ref - logp).exp()  # r + beta pi_ref / pi: the same lambda for every outcome
    assert float(lam.max() - lam.min()) < 1e-9 * max(1.0, float(lam.abs().max()))
    # A grid over the simplex finds nothing better.
    best = _j_forward(logp, ref, r, beta)
    grid = np.linspace(1e-4, 1 - 1e-4, 300)
    a, b = np.meshgrid(grid, grid)
    ok = a + b < 1
    cand = np.stack([a[ok], b[ok], 1 - a[ok] - b[ok]], -1)
    refp = ref.exp().numpy()
    j = cand @ r.numpy() - beta * ex.kl_divergence(np.broadcast_to(refp, cand.shape), cand)
    assert j.max() <= best + 1e-12
    # Each optimum wins its own objective.
    rev = ex.optimal_policy(ref, r, beta)
    assert best >= _j_forward(rev, ref, r, beta)
    assert _j_reverse(rev, ref, r, beta) >= _j_reverse(logp, ref, r, beta)


def test_forward_optimum_limits() -> None:
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=F64).log()
    r = torch.tensor([1.0, 0.0, 2.0], dtype=F64)
    torch.testing.assert_close(ex.forward_kl_optimal_policy(ref, r, 1e6).exp(), ref.exp(), rtol=0, atol=1e-5)
    cold = ex.forward_kl_optimal_policy(ref, r, 1e-6).exp()
    assert float(cold[2]) > 1 - 1e-5
    # Mass-covering: every outcome of pi_ref keeps mass >= beta pi_ref / (lambda - r), here > 0.
    assert bool(torch.all(cold > 0))


def test_forward_penalty_ignores_outcomes_outside_the_reference() -> None:
    ref = torch.tensor([0.5, 0.5, 0.0], dtype=F64).log()
    pi = ex.forward_kl_optimal_policy(ref, torch.tensor([0.0, 1.0, 3.0], dtype=F64), 1.0).exp()
    torch.testing.assert_close(pi, torch.tensor([1 / 6, 1 / 4, 7 / 12], dtype=F64), rtol=0, atol=1e-14)
    # The reverse penalty never puts mass there, whatever the reward.
    assert float(ex.optimal_policy(ref, torch.tensor([0.0, 1.0, 3.0], dtype=F64), 1.0).exp()[2]) == 0.0
    # Two outside outcomes tie: they share what is left. A worse outside outcome gets nothing.
    ref4 = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=F64).log()
    tied = ex.forward_kl_optimal_policy(ref4, torch.tensor([0.0, 1.0, 3.0, 3.0], dtype=F64), 1.0).exp()
    assert float(tied[2]) == pytest.approx(7 / 24, abs=1e-14) and float(tied[3]) == float(tied[2])
    low = ex.forward_kl_optimal_policy(ref, torch.tensor([0.0, 1.0, 1.2], dtype=F64), 1.0).exp()
    assert float(low[2]) == 0.0


# --- bad input ------------------------------------------------------------------------------

_REF = torch.tensor([0.5, 0.5], dtype=F64).log()
_R = torch.tensor([0.0, 1.0], dtype=F64)
_G = ex.Gaussian(0.0, 1.0)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: ex.kl_divergence([0.5, 0.6], [0.5, 0.5]), ValueError, "p must sum to 1"),
        (lambda: ex.kl_divergence([0.5, 0.5], [1.5, -0.5]), ValueError, "q must hold finite probabilities"),
        (lambda: ex.kl_divergence([0.5, 0.5], [0.2, 0.3, 0.5]), ValueError, "same shape"),
        (lambda: ex.kl_divergence("ab", [0.5, 0.5]), TypeError, "p must be an array of probabilities"),
        (lambda: ex.kl_divergence([True, False], [0.5, 0.5]), TypeError, "booleans"),
        (lambda: ex.kl_divergence(0.5, 0.5), ValueError, "at least one category"),
        (lambda: ex.kl_divergence([np.nan, 1.0], [0.5, 0.5]), ValueError, "finite"),
        (lambda: ex.entropy([0.5, 0.5], unit="dits"), ValueError, "unit must be one of"),
        (lambda: ex.cross_entropy([1.0], [1.0], unit=2), ValueError, "unit"),
        (lambda: ex.Gaussian(0.0, 0.0), ValueError, "std"),
        (lambda: ex.Gaussian(math.inf, 1.0), ValueError, "mean"),
        (lambda: ex.Gaussian("0", 1.0), TypeError, "mean"),
        (lambda: ex.GaussianMixture((0.5, 0.6), (0.0, 1.0), (1.0, 1.0)), ValueError, "sum to 1"),
        (lambda: ex.GaussianMixture((1.0,), (0.0, 1.0), (1.0, 1.0)), ValueError, "same length"),
        (lambda: ex.GaussianMixture((1.0,), (0.0,), (-1.0,)), ValueError, "stds must be > 0"),
        (lambda: ex.GaussianMixture(1.0, (0.0,), (1.0,)), TypeError, "weights must be a sequence"),
        (lambda: ex.GaussianMixture.of((0.0, 1.0)), TypeError, "gaussian must be a Gaussian"),
        (lambda: ex.kl_gaussians(_G, MIX), TypeError, "q must be a Gaussian"),
        (lambda: ex.kl_quadrature(_G, (0.0, 1.0)), TypeError, "q must be a Gaussian or a GaussianMixture"),
        (lambda: ex.kl_quadrature(_G, _G, n_points=2), ValueError, "n_points must be >= 3"),
        (lambda: ex.fit_forward_kl([0.0, 1.0]), TypeError, "p must be"),
        (lambda: ex.fit_reverse_kl(MIX, (0.0, 1.0)), TypeError, "init must be a Gaussian"),
        (lambda: ex.fit_reverse_kl(MIX, _G, tol=0.0), ValueError, "tol"),
        (lambda: ex.kl_profile(MIX, [0.0], "sideways"), ValueError, "direction must be one of"),
        (lambda: ex.kl_profile(MIX, [], "forward"), ValueError, "means must be a non-empty"),
        (lambda: ex.kl_profile(MIX, [0.0], "reverse", n_stds=1), ValueError, "n_stds must be >= 2"),
        (lambda: ex.kl_profile(MIX, "abc", "forward"), TypeError, "means must be an array"),
        (lambda: ex.forward_kl_optimal_policy(_REF, _R, 0.0), ValueError, "beta"),
        (lambda: ex.forward_kl_optimal_policy(_REF.exp(), _R, 1.0), ValueError, "ref_logprobs"),
        (lambda: ex.forward_kl_optimal_policy(_REF, _R[:1], 1.0), ValueError, "reward must have shape"),
        (lambda: ex.forward_kl_optimal_policy(_REF.tolist(), _R, 1.0), TypeError, "ref_logprobs"),
    ],
)
def test_bad_input_is_named(call, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
