"""The shared input checks of kltutorial._validation: what each accepts, returns and rejects."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from kltutorial import _validation as v


def test_accepted_values_are_returned_normalised():
    assert v.check_real(torch.tensor(2.5), "x") == 2.5 and isinstance(v.check_real(np.float32(1), "x"), float)
    assert v.check_real(np.array(-3), "x") == -3.0  # a negative KL estimate is a valid observation
    assert v.check_coef(0, "beta") == 0.0 and v.check_positive(np.int64(2), "x") == 2.0
    assert v.check_greater(1.5, "factor", 1.0) == 1.5
    assert v.check_positive_int(np.int32(3), "n") == 3 and v.check_nonnegative_int(0, "n") == 0
    assert v.check_seed(0) == 0
    mask = v.check_mask(torch.tensor([[1.0, 0.0]]), "m", torch.Size([1, 2]))
    assert mask.dtype == torch.bool and mask.tolist() == [[True, False]]
    assert v.check_choice("k1", "estimator", {"k1": 1, "k2": 2}) == "k1"  # any collection of names
    z = torch.tensor([[[0.0, -math.inf]]])
    assert v.check_float_tensor(z, "logits", ndim=3, allow_inf=True) is z


def test_check_float_tensor_has_no_allow_empty_and_always_rejects_empty():
    assert "allow_empty" not in inspect.signature(v.check_float_tensor).parameters
    with pytest.raises(ValueError, match=r"x must not be empty, got shape \(0, 3\)"):
        v.check_float_tensor(torch.zeros(0, 3), "x")


def test_check_logits_reads_no_values():
    # NaN is left to the kernels, which find it in the rows they normalise (see kltutorial.logprobs)
    z = torch.full((1, 2, 3), math.nan)
    assert v.check_logits(z, "logits") is z


def test_rng_and_generator_checks_keep_their_signatures():
    # simulate.py and toyrlhf import these; their call forms must keep working
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    assert v.check_rng(rng) is rng and v.check_rng(rng, "noise_rng") is rng
    assert v.check_generator(gen) is gen and v.check_generator(gen, "g") is gen


BAD_INPUTS = [
    # (id, callable, kwargs, exception, message regex)
    ("float-not-tensor", v.check_float_tensor, dict(x=[1.0], name="x"), TypeError,
     "x must be a torch.Tensor, got list"),
    ("float-int", v.check_float_tensor, dict(x=torch.ones(2, dtype=torch.long), name="x"), TypeError,
     "x must be a floating-point tensor, got dtype torch.int64"),
    ("float-rank", v.check_float_tensor, dict(x=torch.ones(2), name="x", ndim=(2, 3)), ValueError,
     r"x must have 2 or 3 dimensions, got shape \(2\)"),
    ("float-nan", v.check_float_tensor, dict(x=torch.tensor([math.nan]), name="x"), ValueError,
     "x contains NaN"),
    ("float-neg-inf", v.check_float_tensor, dict(x=torch.tensor([-math.inf]), name="x"), ValueError,
     "x contains inf; expected finite values"),
    ("float-pos-inf", v.check_float_tensor, dict(x=torch.tensor([math.inf]), name="x", allow_inf=True),
     ValueError, r"x contains \+inf; only -inf"),
    ("logits-rank", v.check_logits, dict(x=torch.zeros(2, 3), name="z"), ValueError,
     r"z must have 3 dimensions \(B, T, V\)"),
    ("logits-empty", v.check_logits, dict(x=torch.zeros(2, 3, 0), name="z"), ValueError,
     r"z must not be empty, got shape \(2, 3, 0\)"),
    ("pair-shape", v.check_tensor_pair, dict(a=torch.zeros(2), a_name="a", b=torch.zeros(3), b_name="b"),
     ValueError, r"a and b must have the same shape, got \(2,\) and \(3,\)"),
    ("scores-batch", v.check_scores, dict(scores=torch.zeros(3), name="s", batch=2), ValueError,
     r"s must have shape \(2,\), one score per sequence, got \(3,\)"),
    ("tokens-bool", v.check_token_ids,
     dict(tokens=torch.ones(2, dtype=torch.bool), name="t", shape=torch.Size([2]), vocab_size=3),
     TypeError, "t must hold integer token ids"),
    ("mask-complex", v.check_mask,
     dict(mask=torch.ones(2, dtype=torch.complex64), name="m", shape=torch.Size([2])),
     TypeError, "m must be boolean, integer or float"),
    ("real-str", v.check_real, dict(x="1", name="kl"), TypeError, "kl must be a real number, got str"),
    ("real-bool", v.check_real, dict(x=True, name="kl"), TypeError, "kl must be a real number, got bool"),
    ("real-bool-tensor", v.check_real, dict(x=torch.tensor(True), name="kl"), TypeError, "got bool"),
    ("real-complex", v.check_real, dict(x=np.array(1j), name="kl"), TypeError, "got complex"),
    ("real-nan", v.check_real, dict(x=torch.tensor(math.nan), name="kl"), ValueError, "kl must be a finite"),
    ("real-vector", v.check_real, dict(x=torch.ones(3), name="kl"), ValueError,
     r"kl must be a single number, got an array of shape \(3,\)"),
    ("coef-negative", v.check_coef, dict(x=-1, name="beta"), ValueError, "beta must be a finite number >= 0"),
    ("greater", v.check_greater, dict(x=1.0, name="band", bound=1.0), ValueError,
     "band must be a finite number > 1, got 1.0"),
    ("positive-int-zero", v.check_positive_int, dict(x=0, name="n"), ValueError, "n must be >= 1, got 0"),
    ("nonneg-int-neg", v.check_nonnegative_int, dict(x=-2, name="n"), ValueError, "n must be >= 0, got -2"),
    ("nonneg-int-float", v.check_nonnegative_int, dict(x=2.0, name="n"), TypeError, "n must be an int"),
    ("seed-negative", v.check_seed, dict(seed=-1), ValueError, "seed must be >= 0"),
    ("seed-str", v.check_seed, dict(seed="0", name="data_seed"), TypeError, "data_seed must be an int"),
    ("choice", v.check_choice, dict(x="max", name="reduction", choices=("sum", "mean")), ValueError,
     "reduction must be one of 'sum', 'mean'; got 'max'"),
    ("rng", v.check_rng, dict(rng=0), TypeError, r"rng must be a numpy.random.Generator \(e.g. np.random"),
    ("generator", v.check_generator, dict(generator=np.random.default_rng(0)), TypeError,
     "generator must be a torch.Generator"),
]


@pytest.mark.parametrize(("call", "kwargs", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)
