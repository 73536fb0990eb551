"""Tests of kltutorial.studies.scaling_fit: Gao et al.'s best-of-n and RL forms and their least-squares fit.

Closed forms (R at hand-picked d, the peak of each form), exact recovery of known coefficients from points
that follow a form, the normal equations of least squares on noisy points, and a table of bad inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kltutorial.studies.scaling_fit import FORMS, GaoFit, fit_gao, gao_gain


def test_gain_closed_forms() -> None:
    # d = 0, 1, 2, 3: best-of-n R = d (alpha - beta d) with alpha = 3, beta = 1.
    np.testing.assert_allclose(gao_gain([0.0, 1.0, 4.0, 9.0], 3.0, 1.0, "bon"), [0.0, 2.0, 2.0, 0.0])
    # RL: R(1) = alpha (log 1 = 0), R(e) = e (alpha - beta), R(0) = 0 (d log d -> 0).
    e = math.e
    np.testing.assert_allclose(gao_gain([0.0, 1.0, e**2], 2.0, 0.5, "rl"), [0.0, 2.0, e * 1.5])
    # Below d = 1, log d < 0: the RL form's beta term adds to R.
    assert gao_gain([0.25], 1.0, 1.0, "rl")[0] > gao_gain([0.25], 1.0, 0.0, "rl")[0]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("alpha", "beta"), [(3.0, 1.0), (1.6, 2.0), (0.5, -0.3), (-1.0, 0.2)])
def test_fit_recovers_known_coefficients_exactly(form: str, alpha: float, beta: float) -> None:
    kl = np.linspace(0.0, 9.0, 31)  # d from 0 to 3, the point at 0 included
    fit = fit_gao(kl, gao_gain(kl, alpha, beta, form), form)
    assert isinstance(fit, GaoFit) and fit.form == form
    assert fit.alpha == pytest.approx(alpha, abs=1e-12) and fit.beta == pytest.approx(beta, abs=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12) and fit.rms < 1e-12
    np.testing.assert_allclose(fit.d, np.sqrt(kl))
    np.testing.assert_allclose(fit.predict(kl), fit.gain, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_fit_solves_the_normal_equations(form: str) -> None:
    rng = np.random.default_rng(0)
    kl = rng.uniform(0.0, 6.0, 50)
    gain = gao_gain(kl, 2.0, 1.0, form) + rng.normal(0.0, 0.2, 50)
    fit = fit_gao(kl, gain, form)
    d = np.sqrt(kl)
    second = d**2 if form == "bon" else d * np.log(d)
    X = np.stack([d, -second], axis=1)
    # Least squares: the residuals are orthogonal to both features.
    np.testing.assert_allclose(X.T @ fit.residuals, 0.0, atol=1e-9)
    assert 0.0 < fit.r2 < 1.0
    assert fit.rms == pytest.approx(float(np.sqrt(np.mean(fit.residuals**2))))
    assert fit.rms_where(d < 1) == pytest.approx(float(np.sqrt(np.mean(fit.residuals[d < 1] ** 2))))


@pytest.mark.parametrize(("form", "alpha", "beta", "d_star"), [
    ("bon", 3.0, 1.0, 1.5),  # d* = alpha / (2 beta), R* = alpha^2 / (4 beta)
    ("rl", 2.0, 1.0, math.e),  # d* = exp(alpha / beta - 1), R* = beta d*
])
def test_peak(form: str, alpha: float, beta: float, d_star: float) -> None:
    kl = np.linspace(0.0, 16.0, 17)
    fit = fit_gao(kl, gao_gain(kl, alpha, beta, form), form)
    assert fit.peak_kl == pytest.approx(d_star**2)
    grid = np.linspace(0.0, 16.0, 160_001)
    values = fit.predict(grid)
    assert fit.peak_gain == pytest.approx(values.max(), rel=1e-8)
    assert grid[values.argmax()] == pytest.approx(d_star**2, abs=1e-3)
    # A form that never turns down has no peak.
    flat = fit_gao(kl, gao_gain(kl, 1.0, -0.5, form), form)
    assert flat.peak_kl == math.inf and flat.peak_gain == math.inf


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: fit_gao([0.0, 1.0, -0.5], [0.0, 1.0, 2.0], "bon"), ValueError, "kl must be >= 0"),
    (lambda: fit_gao([0.0, 1.0, np.nan], [0.0, 1.0, 2.0], "bon"), ValueError, "NaN or inf"),
    (lambda: fit_gao([0.0, 1.0, 2.0], [0.0, np.inf, 2.0], "rl"), ValueError, "gain contains"),
    (lambda: fit_gao([0.0, 1.0, 2.0], [0.0, 1.0], "bon"), ValueError, "same length"),
    (lambda: fit_gao([[0.0, 1.0]], [[0.0, 1.0]], "bon"), ValueError, "1-D"),
    (lambda: fit_gao([], [], "bon"), ValueError, "non-empty"),
    (lambda: fit_gao([0.0, 1.0, 1.0], [0.0, 1.0, 1.0], "bon"), ValueError, "two points"),
    (lambda: fit_gao([0.0, 1.0, 2.0], [0.0, 1.0, 2.0], "ppo"), ValueError, "form must be one of"),
    (lambda: fit_gao(["a", "b"], [0.0, 1.0], "bon"), TypeError, "kl must be a sequence"),
    (lambda: gao_gain([1.0], "3", 1.0, "bon"), TypeError, "alpha must be a real number"),
    (lambda: gao_gain([1.0], 3.0, math.nan, "rl"), ValueError, "beta must be a finite number"),
    (lambda: fit_gao([1.0, 4.0], [1.0, 2.0], "bon").rms_where([1, 0]), ValueError, "boolean array"),
    (lambda: fit_gao([1.0, 4.0], [1.0, 2.0], "bon").rms_where(np.zeros(2, bool)), ValueError, "no point"),
])
def test_bad_input(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
