"""kltutorial.compat's KL penalties against the peers' own code, written out below as their sources have it:
verl's ``kl_penalty`` / ``kl_penalty_forward`` (``verl/trainer/ppo/core_algos.py``, with the ``+``
straight-through), TRL v0.11.4's ``PPOTrainer._kl_penalty`` and ``compute_rewards`` (as functions) and
OpenRLHF's ``compute_approx_kl`` (v0.11.0, and with PR #1309's ``log_probs_old``/``unbiased_gradient``)
and ``compute_reward``.
Values agree to float32 rounding (k3 is computed here as expm1(-d) + d, theirs as exp(-d) - 1 + d);
gradients, clamps, padding, output dtypes and exceptions are theirs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kltutorial.compat import openrlhf, trl, verl

# --- the peers' code ------------------------------------------------------------------------------------


def _verl_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def _verl_penalty(logprob, ref_logprob, kl_penalty):
    base = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = _verl_forward(logprob, ref_logprob, base)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def _trl_penalty(logprob, ref_logprob, kl_penalty):
    if kl_penalty == "kl":
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty == "full":
        return F.kl_div(ref_logprob, logprob, log_target=True, reduction="none").sum(-1)
    raise NotImplementedError


def _trl_compute_rewards(scores, logprobs, ref_logprobs, masks, kl_coef, kl_penalty):
    rewards, non_score_rewards, kls = [], [], []
    for score, logprob, ref_logprob, mask in zip(scores, logprobs, ref_logprobs, masks, strict=True):
        kl = _trl_penalty(logprob, ref_logprob, kl_penalty)
        kls.append(kl)
        non_score_reward = -kl_coef * kl
        non_score_rewards.append(non_score_reward)
        reward = non_score_reward.clone()
        last_non_masked_index = mask.nonzero()[-1]
        reward[last_non_masked_index] += score
        rewards.append(reward)
    return torch.stack(rewards), torch.stack(non_score_rewards), torch.stack(kls)


def _pair(seed=0, shape=(4, 16), scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lp = -scale * torch.rand(shape, generator=g, dtype=torch.float64)
    ref = -scale * torch.rand(shape, generator=g, dtype=torch.float64)
    lp[0, 0], ref[0, 0] = -40.0, -0.1  # a log-ratio beyond verl's clamp
    return lp.to(dtype), ref.to(dtype)


VERL_NAMES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
              "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"]


@pytest.mark.parametrize("name", VERL_NAMES)
def test_verl_kl_penalty_value_and_gradient_are_verls(name):
    lp, ref = _pair()
    ours_lp, theirs_lp = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ours = verl.kl_penalty(ours_lp, ref, name)
    theirs = _verl_penalty(theirs_lp, ref, name)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["kl", "abs", "mse", "low_var_kl", "k3"])
def test_verl_forward_and_its_plain_names(name):
    lp, ref = _pair(1)
    torch.testing.assert_close(verl.kl_penalty_forward(lp, ref, name), _verl_forward(lp, ref, name),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("call", "name"), [(verl.kl_penalty, "full"), (verl.kl_penalty, "k4"),
                                            (verl.kl_penalty_forward, "k3+"), (trl.kl_penalty, "k3")])
def test_names_the_peer_lacks_raise_its_not_implemented_error(call, name):
    lp, ref = _pair()
    with pytest.raises(NotImplementedError, match=repr(name)):
        call(lp, ref, name)


def test_half_precision_comes_back_in_the_inputs_dtype_rounded_once():
    lp, ref = _pair(2, dtype=torch.bfloat16)
    out = verl.kl_penalty(lp, ref, "k3")
    assert out.dtype == torch.bfloat16
    exact = _verl_forward(lp.double(), ref.double(), "k3")
    # computed in float32 and rounded once: within half a bfloat16 ulp of the float64 value
    assert torch.all((out.double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-30)


@pytest.mark.parametrize("name", ["kl", "abs", "mse"])
def test_trl_kl_penalty_is_trls(name):
    lp, ref = _pair(3, dtype=torch.float64)
    torch.testing.assert_close(trl.kl_penalty(lp, ref, name), _trl_penalty(lp, ref, name))


def test_trl_full_is_trls_kl_div_on_log_softmax_tensors_of_any_leading_shape():
    g = torch.Generator().manual_seed(4)
    lp = torch.log_softmax(torch.randn(3, 5, 11, generator=g, dtype=torch.float64), -1)
    ref = torch.log_softmax(torch.randn(3, 5, 11, generator=g, dtype=torch.float64), -1)
    torch.testing.assert_close(trl.kl_penalty(lp, ref, "full"), _trl_penalty(lp, ref, "full"))
    torch.testing.assert_close(trl.kl_penalty(lp[0], ref[0], "full"), _trl_penalty(lp[0], ref[0], "full"))


@pytest.mark.parametrize("name", ["kl", "abs", "mse"])
def test_trl_compute_rewards_returns_trls_three_tensors_with_its_padding(name):
    lp, ref = _pair(5, dtype=torch.float64)
    masks = torch.ones(lp.shape, dtype=torch.long)
    masks[1, 10:] = 0  # right padding: TRL leaves -kl_coef * kl there
    masks[2, :3] = 0  # left padding
    scores = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    ours = trl.compute_rewards(scores, lp, ref, masks, kl_coef=0.2, kl_penalty=name)
    theirs = _trl_compute_rewards(scores, lp, ref, masks, 0.2, name)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
    assert ours[0][1, 12] != 0  # padding is not zeroed, as TRL's


def test_trl_compute_rewards_rejects_a_sequence_without_a_valid_token():
    lp, ref = _pair(dtype=torch.float64)
    masks = torch.ones(lp.shape)
    masks[3] = 0
    with pytest.raises(ValueError, match=r"masks has no valid token in sequence\(s\) \[3\]"):
        trl.compute_rewards(torch.zeros(4, dtype=torch.float64), lp, ref, masks, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef must be a finite number >= 0"):
        trl.compute_rewards(torch.zeros(4, dtype=torch.float64), lp, ref, torch.ones(lp.shape), kl_coef=-1.0)


def test_errors_name_the_peers_arguments():
    lp, ref = _pair()
    with pytest.raises(ValueError, match="ref_logprob"):
        verl.kl_penalty(lp, ref[:, :3], "k1")
    with pytest.raises(ValueError, match="logprob contains NaN"):
        trl.kl_penalty(torch.full((2,), float("nan")), torch.zeros(2), "kl")


# --- OpenRLHF v0.11.0 (openrlhf/models/utils.py), compute_approx_kl with PR #1309 --------------------------


def _openrlhf_approx_kl(log_probs, log_probs_base, log_probs_old=None, kl_estimator="k1",
                        unbiased_gradient=False):  # v0.11.0's when unbiased_gradient is False
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        value = log_ratio
    elif kl_estimator == "k2":
        value = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        value = (-log_ratio).exp() - 1 + log_ratio
    else:
        raise ValueError(f"Unknown kl_estimator: {kl_estimator}")
    value = value.clamp(min=-10, max=10)
    if not unbiased_gradient:
        return value
    if log_probs_old is None:
        w = 1.0
    else:
        w = (log_probs.float() - log_probs_old.float()).exp().clamp(max=10.0).detach()
    grad_surrogate = w * (log_ratio**2 / 2.0)
    return value.detach() + grad_surrogate - grad_surrogate.detach()


def _openrlhf_reward(r, kl_coef, kl, action_mask=None, reward_clip_range=None):
    if kl_coef <= 0.0:
        kl_coef = 0.0
    if reward_clip_range:
        r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_openrlhf_compute_approx_kl_is_openrlhfs(name, dtype):
    lp, ref = _pair(6, dtype=dtype)
    ours_lp, theirs_lp = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ours = openrlhf.compute_approx_kl(ours_lp, ref, kl_estimator=name)
    theirs = _openrlhf_approx_kl(theirs_lp, ref, kl_estimator=name)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-2, atol=1e-6)
    with pytest.raises(ValueError, match="Unknown kl_estimator: k3\\+"):
        openrlhf.compute_approx_kl(lp, ref, kl_estimator="k3+")


@pytest.mark.parametrize("clip", [None, (-1.0, 1.0)])
def test_openrlhf_compute_reward_is_openrlhfs(clip):
    lp, ref = _pair(7, dtype=torch.float64)
    kl = openrlhf.compute_approx_kl(lp, ref, "k1")
    mask = torch.ones(kl.shape, dtype=torch.long)
    mask[0, 12:] = 0
    mask[3, :2] = 0
    r = torch.tensor([2.5, -0.3, 0.0, -4.0])
    ours = openrlhf.compute_reward(r, 0.05, kl, action_mask=mask, reward_clip_range=clip)
    torch.testing.assert_close(ours, _openrlhf_reward(r, 0.05, kl, mask, clip))


def test_openrlhf_compute_reward_raises_where_it_would_be_silently_wrong():
    kl = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match=r"action_mask has no valid token in sequence\(s\) \[1\]"):
        openrlhf.compute_reward(torch.zeros(2), 0.1, kl, action_mask=mask)
    with pytest.raises(ValueError, match="kl_coef must be a finite number >= 0"):
        openrlhf.compute_reward(torch.zeros(2), -0.1, kl, action_mask=torch.ones(2, 3))
    with pytest.raises(TypeError, match="needs action_mask"):
        openrlhf.compute_reward(torch.zeros(2), 0.1, kl)


# --- compute_approx_kl with PR #1309's arguments ------------------------------------------------------------


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_openrlhf_unbiased_gradient_is_openrlhfs(name, off_policy, dtype):
    g = torch.Generator().manual_seed(8)
    lp = (-3 * torch.rand(4, 16, generator=g, dtype=torch.float64)).to(dtype)
    base = (-3 * torch.rand(4, 16, generator=g, dtype=torch.float64)).to(dtype)
    lp[0, 0], base[0, 0] = -30.0, -0.1  # clamped value, unclamped gradient
    old = (lp.double() + 2 * torch.randn(4, 16, generator=g, dtype=torch.float64)).to(dtype)
    old = old if off_policy else None
    ours_lp, theirs_lp = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ours = openrlhf.compute_approx_kl(ours_lp, base, old, name, unbiased_gradient=True)
    theirs = _openrlhf_approx_kl(theirs_lp, base, old, name, unbiased_gradient=True)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-6, atol=1e-6)
    # the old log-probs are ignored without unbiased_gradient, as OpenRLHF's
    torch.testing.assert_close(openrlhf.compute_approx_kl(lp, base, old, name),
                               _openrlhf_approx_kl(lp, base, old, name), rtol=1e-6, atol=1e-6)


def test_openrlhf_v0_11_positional_call_keeps_its_meaning():
    lp, base = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert torch.equal(openrlhf.compute_approx_kl(lp, base, "k3"), openrlhf.compute_approx_kl(lp, base,
                                                                                              kl_estimator="k3"))
    with pytest.raises(TypeError, match="kl_estimator twice"):
        openrlhf.compute_approx_kl(lp, base, "k3", "k2")


# --- dtypes: the peers', for every input dtype -----------------------------------------------------------
# Read in the peers' source: verl main 1dda039b9 (the same code as v0.9.0) verl/trainer/ppo/core_algos.py
# kl_penalty and kl_penalty_forward; TRL v0.11.4 trl/trainer/ppo_trainer.py PPOTrainer._kl_penalty and
# compute_rewards; OpenRLHF v0.11.0 openrlhf/models/utils.py compute_approx_kl (and PR #1309, commit
# 8ac8e063, which keeps its log_probs.float() - log_probs_base.float()) and compute_reward.

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
DTYPES = [F64, F32, F16, BF16]
SAME = {F64: F64, F32: F32, F16: F16, BF16: BF16}

#: function -> {the inputs' dtype (log-probs, or kl for compute_reward): the dtype the peer returns}
KL_DTYPES = {
    "verl.kl_penalty": SAME,  # logprob - ref_logprob and what follows, in their dtype
    "verl.kl_penalty_forward": SAME,
    "trl.kl_penalty": SAME,
    "trl.kl_penalty('full')": SAME,  # F.kl_div(ref_logprob, logprob, log_target=True).sum(-1)
    "trl.compute_rewards": SAME,  # rewards, non_score_rewards, kls: all in the kls' dtype
    "openrlhf.compute_approx_kl": {F64: F32, F32: F32, F16: F32, BF16: F32},  # log_probs.float() - ...
    "openrlhf.compute_approx_kl(unbiased_gradient=True)": {F64: F32, F32: F32, F16: F32, BF16: F32},
    "openrlhf.compute_reward": SAME,  # zeros_like(kl) with r.to(kl.dtype), plus -kl_coef * kl
}

_MASKS = torch.tensor([[1] * 16, [1] * 10 + [0] * 6, [0] * 3 + [1] * 13, [1] * 16])
_SCORES = torch.tensor([0.5, -1.0, 2.0, 0.25], dtype=F64)


def _full_pair(dtype, seed=13):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(3 * torch.randn(4, 5, 11, generator=g, dtype=F64), -1)
    ref = torch.log_softmax(3 * torch.randn(4, 5, 11, generator=g, dtype=F64), -1)
    return lp.to(dtype), ref.to(dtype)


def _kl_calls(name):
    """(ours, theirs): each a function of (logprob, ref_logprob) returning a tuple of tensors."""
    def k3_old(lp):
        return (lp.double() - 0.3).to(lp.dtype)
    return {
        "verl.kl_penalty": (lambda a, b: (verl.kl_penalty(a, b, "k3+"),),
                            lambda a, b: (_verl_penalty(a, b, "k3+"),)),
        "verl.kl_penalty_forward": (lambda a, b: (verl.kl_penalty_forward(a, b, "low_var_kl"),),
                                    lambda a, b: (_verl_forward(a, b, "low_var_kl"),)),
        "trl.kl_penalty": (lambda a, b: (trl.kl_penalty(a, b, "mse"),),
                           lambda a, b: (_trl_penalty(a, b, "mse"),)),
        "trl.kl_penalty('full')": (lambda a, b: (trl.kl_penalty(a, b, "full"),),
                                   lambda a, b: (_trl_penalty(a, b, "full"),)),
        "trl.compute_rewards": (
            lambda a, b: trl.compute_rewards(_SCORES, a, b, _MASKS, kl_coef=0.2, kl_penalty="abs"),
            lambda a, b: _trl_compute_rewards(_SCORES, a, b, _MASKS, 0.2, "abs")),
        "openrlhf.compute_approx_kl": (lambda a, b: (openrlhf.compute_approx_kl(a, b, kl_estimator="k3"),),
                                       lambda a, b: (_openrlhf_approx_kl(a, b, kl_estimator="k3"),)),
        "openrlhf.compute_approx_kl(unbiased_gradient=True)": (
            lambda a, b: (openrlhf.compute_approx_kl(a, b, k3_old(a), "k2", unbiased_gradient=True),),
            lambda a, b: (_openrlhf_approx_kl(a, b, k3_old(a), "k2", unbiased_gradient=True),)),
        "openrlhf.compute_reward": (  # a, the kl; b unused
            lambda a, b: (openrlhf.compute_reward(_SCORES, 0.05, a, _MASKS, (-1.0, 1.0)),),
            lambda a, b: (_openrlhf_reward(_SCORES, 0.05, a, _MASKS, (-1.0, 1.0)),)),
    }[name]


def _inputs(name, dtype, seed=14):
    return _full_pair(dtype, seed) if "full" in name else _pair(seed, dtype=dtype)


@pytest.mark.parametrize("name", list(KL_DTYPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kl_functions_return_the_peers_dtype(name, dtype):
    ours_fn, theirs_fn = _kl_calls(name)
    lp, ref = _inputs(name, dtype)
    for ours, theirs in zip(ours_fn(lp, ref), theirs_fn(lp, ref), strict=True):
        assert ours.dtype == theirs.dtype == KL_DTYPES[name][dtype]
        assert ours.shape == theirs.shape


@pytest.mark.parametrize("name", ["verl.kl_penalty", "verl.kl_penalty_forward", "trl.kl_penalty",
                                  "trl.kl_penalty('full')", "trl.compute_rewards",
                                  "openrlhf.compute_approx_kl"])
@pytest.mark.parametrize("lp_dtype", DTYPES)
@pytest.mark.parametrize("ref_dtype", DTYPES)
def test_kl_of_two_dtypes_has_the_peers_promoted_dtype(name, lp_dtype, ref_dtype):
    # theirs compute logprob - ref_logprob: float32 with float64 gives float64, float16 with bfloat16 float32
    ours_fn, theirs_fn = _kl_calls(name)
    lp, _ = _inputs(name, lp_dtype)
    _, ref = _inputs(name, ref_dtype)
    expected = F32 if name.startswith("openrlhf") else torch.promote_types(lp_dtype, ref_dtype)
    for ours, theirs in zip(ours_fn(lp, ref), theirs_fn(lp, ref), strict=True):
        assert ours.dtype == theirs.dtype == expected


@pytest.mark.parametrize("name", [n for n, table in KL_DTYPES.items() if table[F64] == F64])
def test_float64_kl_keeps_float64_precision(name):
    ours_fn, theirs_fn = _kl_calls(name)
    lp, ref = _inputs(name, F64, seed=15)
    # the reference: the peer's own code, in float64 throughout for float64 input
    for ours, exact in zip(ours_fn(lp, ref), theirs_fn(lp, ref), strict=True):
        assert ours.dtype == exact.dtype == F64
        assert (exact.float().double() - exact).abs().max() > 1e-10  # float32 arithmetic would miss 1e-12
        torch.testing.assert_close(ours, exact, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_openrlhf_float64_input_is_rounded_once_to_its_float32(name):
    # OpenRLHF returns float32 whatever the input (its log_probs.float() - log_probs_base.float()), by
    # design; here float64 input is computed in float64 and rounded once: within half a float32 ulp of the
    # float64 value
    lp, ref = _pair(16, dtype=F64)
    lp[0, 0], ref[0, 0] = -1.0, -1.5  # every value inside the clamp, where the rounding is the only error
    ours = openrlhf.compute_approx_kl(lp, ref, kl_estimator=name)
    exact = {"k1": lp - ref, "k2": (lp - ref) ** 2 / 2, "k3": torch.expm1(ref - lp) + (lp - ref)}[name]
    assert ours.dtype == F32 and exact.abs().max() < 10
    assert torch.all((ours.double() - exact).abs() <= exact.abs() * 2.0**-24 + 1e-45)
