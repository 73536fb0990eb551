"""Tests of kltutorial.exact.gradients (book section 4): the exact expected gradients of the estimators
used as losses against closed forms, against autograd on real samples, on sequences (where the per-token
loss is a partial gradient), and a table of bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from kltutorial import exact as ex
from kltutorial.estimators import kl_estimate
from kltutorial.exact.gradients import (
    EstimatorGradients,
    GradientAgreement,
    estimator_gradients,
    sequence_estimator_gradients,
)

F64 = torch.float64


def _categorical(seed: int, k: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(k, generator=g, dtype=F64)
    ref = torch.log_softmax(torch.randn(k, generator=g, dtype=F64), dim=0)
    return theta, ref


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_gradients_have_their_closed_forms(seed: int) -> None:
    theta, ref = _categorical(seed)
    pi = torch.softmax(theta, 0)
    d = pi.log() - ref
    kl = (pi * d).sum()
    g = estimator_gradients(theta, ref, "k1")
    # d/dθ_j KL(π || ρ) = π_j (Δ_j - KL);  d/dθ_j KL(ρ || π) = π_j - ρ_j.
    assert torch.allclose(g.reverse_kl, pi * (d - kl), atol=1e-15)
    assert torch.allclose(g.forward_kl, pi - ref.exp(), atol=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_loss_gradients(seed: int) -> None:
    theta, ref = _categorical(seed)
    pi = torch.softmax(theta, 0)
    d = pi.log() - ref
    k1 = estimator_gradients(theta, ref, "k1")
    assert float(k1.loss.abs().max()) < 1e-15  # E[∇ log π] = 0
    assert math.isnan(k1.agreement("loss", "reverse").cosine)
    for name, target in [("k2", "reverse"), ("mse", "reverse"), ("k3", "forward"), ("low_var_kl", "forward"),
                         ("k1+", "reverse"), ("k3+", "reverse")]:
        g = estimator_gradients(theta, ref, name)
        assert g.estimator == name
        a = g.agreement("loss", target)
        assert a.max_abs_difference < 1e-14
        assert a.cosine == pytest.approx(1.0) and a.norm_ratio == pytest.approx(1.0)
    # The other pairings differ: k2 is not the forward KL's gradient, k3 not the reverse one's.
    assert estimator_gradients(theta, ref, "k3").agreement("loss", "reverse").max_abs_difference > 1e-3
    assert estimator_gradients(theta, ref, "k2").agreement("loss", "forward").max_abs_difference > 1e-3
    # abs: k' = sign(Δ), so E[sign(Δ) (e_y - π)] = π ⊙ sign(Δ) - π E[sign(Δ)].
    s = torch.sign(d)
    want = pi * s - pi * (pi * s).sum()
    assert torch.allclose(estimator_gradients(theta, ref, "abs").loss, want, atol=1e-15)


@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_of_the_mean_has_the_score_term(seed: int) -> None:
    theta, ref = _categorical(seed)
    pi = torch.softmax(theta, 0)
    d = pi.log() - ref
    # k1 and k3 have mean KL(π || ρ) exactly, so the gradient of their mean is the reverse KL's.
    for name in ("k1", "k3"):
        assert estimator_gradients(theta, ref, name).agreement("mean", "reverse").max_abs_difference < 1e-14
    # k2's mean is E[Δ²/2]: d/dθ_j = π_j (Δ_j²/2 - E[Δ²/2]) + π_j (Δ_j - E[Δ]).
    k2 = 0.5 * d**2
    want = pi * (k2 - (pi * k2).sum()) + pi * (d - (pi * d).sum())
    assert torch.allclose(estimator_gradients(theta, ref, "k2").mean, want, atol=1e-15)
    # k1+: the value of k1 (whose mean's gradient is the KL's) plus the gradient of k2: twice the KL's.
    plus = estimator_gradients(theta, ref, "k1+")
    assert torch.allclose(plus.mean, 2 * plus.reverse_kl, atol=1e-15)


@pytest.mark.parametrize(("name", "target"), [("k1", None), ("k2", "reverse_kl"), ("k3", "forward_kl")])
def test_autograd_on_sampled_tokens_converges_to_the_exact_expectation(name: str, target: str | None) -> None:
    """The 'loss' gradient is what autograd gives on real samples, averaged."""
    theta, ref = _categorical(3, k=5)
    exact = estimator_gradients(theta, ref, name)
    n = 200_000
    gen = torch.Generator().manual_seed(1)
    y = torch.multinomial(torch.softmax(theta, 0), n, replacement=True, generator=gen)
    t = theta.clone().requires_grad_(True)
    per_sample = kl_estimate(torch.log_softmax(t, 0)[y], ref[y], name)  # (N,): samples fixed
    (grad,) = torch.autograd.grad(per_sample.mean(), t)
    assert torch.allclose(grad, exact.loss, atol=6e-3)
    if target is not None:
        assert torch.allclose(exact.loss, getattr(exact, target), atol=1e-14)


def _sequence_pair(V: int, T: int, seed: int) -> tuple[ex.SequenceSpace, torch.Tensor, torch.Tensor]:
    space = ex.SequenceSpace(V, T)
    g = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(1.5 * torch.randn(space.n_prefixes, V, generator=g, dtype=F64), -1)
    theta = ref + 0.8 * torch.randn(space.n_prefixes, V, generator=g, dtype=F64)
    return space, theta, ref


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 3, 0), (3, 3, 1), (3, 2, 2)])
def test_sequence_gradients(V: int, T: int, seed: int) -> None:
    space, theta, ref = _sequence_pair(V, T, seed)
    whole = {
        n: sequence_estimator_gradients(space, theta, ref, n, per_token=False) for n in ("k1", "k2", "k3")
    }
    tokens = {n: sequence_estimator_gradients(space, theta, ref, n) for n in ("k1", "k2", "k3", "k3+")}
    assert float(whole["k1"].loss.abs().max()) < 1e-14 and float(tokens["k1"].loss.abs().max()) < 1e-14
    assert whole["k2"].agreement("loss", "reverse").max_abs_difference < 1e-14
    assert whole["k3"].agreement("loss", "forward").max_abs_difference < 1e-14
    # Per token, k2 (and k3+, which has its gradient) misses the later log-ratios: a partial gradient.
    partial = tokens["k2"].agreement("loss", "reverse")
    assert partial.max_abs_difference > 1e-3 and partial.cosine < 1 - 1e-6
    assert torch.equal(tokens["k3+"].loss, tokens["k2"].loss)
    assert tokens["k3"].agreement("loss", "forward").max_abs_difference > 1e-3


def test_sequence_reverse_kl_gradient_matches_finite_differences() -> None:
    space, theta, ref = _sequence_pair(2, 3, 4)
    g = sequence_estimator_gradients(space, theta, ref, "k1")
    lq = ex.sequence_logprobs(space, ref)

    def kl(t: torch.Tensor) -> float:
        return ex.sequence_kl(ex.sequence_logprobs(space, torch.log_softmax(t, -1)), lq)

    h = 1e-6
    for row, col in [(0, 0), (1, 1), (4, 0), (6, 1)]:
        e = torch.zeros_like(theta)
        e[row, col] = h
        central = (kl(theta + e) - kl(theta - e)) / (2 * h)
        assert float(g.reverse_kl[row, col]) == pytest.approx(central, abs=1e-8)


def test_per_token_k2_is_exact_when_only_the_first_position_differs() -> None:
    """With no log-ratio after the first token, there are no later terms for the per-token loss to miss."""
    space, theta, ref = _sequence_pair(3, 3, 5)
    theta = ref.clone()
    theta[0] = theta[0] + torch.tensor([0.7, -0.4, 0.1], dtype=F64)  # only the empty prefix's row moves
    g = sequence_estimator_gradients(space, theta, ref, "k2")
    assert g.agreement("loss", "reverse").max_abs_difference < 1e-14


def test_length_one_sequences_are_a_categorical() -> None:
    theta, ref = _categorical(6, k=4)
    space = ex.SequenceSpace(4, 1)
    for name in ("k1", "k2", "k3", "abs"):
        a = estimator_gradients(theta, ref, name)
        b = sequence_estimator_gradients(space, theta[None], ref[None], name)
        for field in ("loss", "mean", "reverse_kl", "forward_kl"):
            assert torch.allclose(getattr(a, field), getattr(b, field)[0], atol=1e-15), (name, field)


def test_agreement() -> None:
    g = EstimatorGradients(
        "x",
        loss=torch.tensor([1.0, 0.0]),
        mean=torch.tensor([0.0, 0.0]),
        reverse_kl=torch.tensor([2.0, 0.0]),
        forward_kl=torch.tensor([0.0, 1.0]),
    )
    assert g.agreement() == GradientAgreement(1.0, 1.0, 0.5)
    assert g.agreement("loss", "forward") == GradientAgreement(1.0, 0.0, 1.0)
    assert g.agreement().row() == "  1.0000  1.000"
    zero = g.agreement("mean", "reverse")
    assert math.isnan(zero.cosine) and zero.norm_ratio == 0.0 and zero.max_abs_difference == 2.0
    assert zero.row() == "  2.0000    -  "
    with pytest.raises(ValueError, match="which"):
        g.agreement("value")
    with pytest.raises(ValueError, match="target"):
        g.agreement("loss", "both")


_TH, _REF = _categorical(0, k=3)
_S, _STH, _SREF = _sequence_pair(2, 2, 0)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: estimator_gradients(_TH[None], _REF, "k1"), ValueError, "logits must have 1 dimensions"),
        (lambda: estimator_gradients(_TH.long(), _REF, "k1"), TypeError, "floating-point"),
        (lambda: estimator_gradients(_TH, _REF[:2], "k1"), ValueError, r"ref_logprobs must have shape"),
        (lambda: estimator_gradients(_TH, _REF.exp(), "k1"), ValueError, "logsumexp"),
        (lambda: estimator_gradients(_TH, torch.tensor([0.0, -math.inf, -math.inf], dtype=F64), "k1"),
         ValueError, "ref_logprobs contains inf"),
        (lambda: estimator_gradients(_TH, _REF, "full"), ValueError, "sampled estimator"),
        (lambda: estimator_gradients(_TH, _REF, "k4"), ValueError, "estimator must be one of"),
        (lambda: sequence_estimator_gradients("space", _STH, _SREF, "k1"), TypeError, "SequenceSpace"),
        (lambda: sequence_estimator_gradients(_S, _STH[:2], _SREF, "k1"), ValueError, "logits must have"),
        (lambda: sequence_estimator_gradients(_S, _STH, _SREF[:, :1], "k1"), ValueError, "ref_table"),
        (lambda: sequence_estimator_gradients(_S, _STH, _SREF, "k1", per_token=1), TypeError, "per_token"),
        (lambda: sequence_estimator_gradients(_S, _STH, _SREF, "full"), ValueError, "sampled estimator"),
    ],
)
def test_bad_input_is_named(call, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
