"""The exercise checkers (kltutorial.exercises): each accepts the package's own implementation and a
reader's correct one, rejects plausible wrong answers on the case that exposes them, says "not
implemented yet" for the stub, prints deterministically, and rejects bad arguments clearly."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch

from kltutorial import exercises as exr
from kltutorial.estimators import k3
from kltutorial.exact import kl_divergence
from kltutorial.exercises import CHECKERS, Case, check, register_checker, verdict
from kltutorial.objective import shape_rewards

WIDTH = 88


def _stub(*args):
    raise NotImplementedError


# --- what readers write: right and wrong ---------------------------------------------------------------


def _kl_reader(p, q):
    support = p > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(p[support] * (np.log(p[support]) - np.log(q[support]))))


def _kl_naive(p, q):  # the formula as written: 0 * log(0) is nan
    return float(np.sum(p * np.log(p / q)))


def _kl_swapped(p, q):  # the other direction
    return kl_divergence(q, p)


def _kl_bits(p, q):  # log2: bits, not nats
    return float(np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p / q, 1.0)), 0.0)))


def _k3_reader(log_ratio):
    return torch.expm1(-log_ratio) + log_ratio


def _k3_sign(log_ratio):  # the ratio the other way up, r = pi / pi_ref
    return torch.expm1(log_ratio) - log_ratio


def _k3_naive(log_ratio):  # exp(-x) - 1 loses the digits of a small x
    return torch.exp(-log_ratio) - 1 + log_ratio


def _k3_ratio_first(log_ratio):  # r computed first: exp(-120) underflows to 0 in float32, log 0 = -inf
    r = torch.exp(-log_ratio)
    return (r - 1) - torch.log(r)


def _k3_mean(log_ratio):  # the estimate averaged: a number, not one per token
    return (torch.expm1(-log_ratio) + log_ratio).mean()


def _last_valid(mask):
    positions = torch.arange(mask.shape[1])
    return torch.where(mask.bool(), positions, -1).amax(dim=1)


def _rewards_reader(scores, per_token_kl, mask, beta):
    rewards = torch.where(mask.bool(), -beta * per_token_kl, torch.zeros_like(per_token_kl))
    rewards[torch.arange(len(scores)), _last_valid(mask)] += scores
    return rewards


def _rewards_no_mask(scores, per_token_kl, mask, beta):  # pads keep -beta * kl
    rewards = -beta * per_token_kl
    rewards[torch.arange(len(scores)), _last_valid(mask)] += scores
    return rewards


def _rewards_count_minus_one(scores, per_token_kl, mask, beta):  # right for right padding only
    rewards = torch.where(mask.bool(), -beta * per_token_kl, torch.zeros_like(per_token_kl))
    rewards[torch.arange(len(scores)), mask.sum(dim=1) - 1] += scores
    return rewards


def _rewards_last_column(scores, per_token_kl, mask, beta):  # the score always at position T - 1
    rewards = torch.where(mask.bool(), -beta * per_token_kl, torch.zeros_like(per_token_kl))
    rewards[:, -1] += scores
    return rewards


def _rewards_sign(scores, per_token_kl, mask, beta):  # +beta: a bonus for moving away
    return _rewards_reader(scores, -per_token_kl, mask, beta)


PACKAGE = {"kl_divergence": kl_divergence, "k3": k3, "shape_rewards": shape_rewards}
READERS = {"kl_divergence": _kl_reader, "k3": _k3_reader, "shape_rewards": _rewards_reader}
# name, wrong answer, the status it gets, the case that exposes it, a phrase of the message
WRONG = [
    ("kl_divergence", _kl_naive, "wrong", 3, "got      nan"),
    ("kl_divergence", _kl_swapped, "wrong", 1, "expected 0.143841"),
    ("kl_divergence", _kl_bits, "wrong", 1, "got      0.207519"),
    ("k3", _k3_sign, "wrong", 1, "first difference at index 0"),
    ("k3", _k3_naive, "wrong", 2, "tiny log-ratios"),
    ("k3", _k3_ratio_first, "wrong", 4, "expected 119, got inf"),
    ("k3", _k3_mean, "wrong", 1, "expected shape (5,), got shape ()"),
    ("shape_rewards", _rewards_no_mask, "wrong", 2, "at index (0, 3): expected 0, got -0.15"),
    ("shape_rewards", _rewards_count_minus_one, "wrong", 2, "at index (1, 1): expected 0, got -1"),
    ("shape_rewards", _rewards_last_column, "wrong", 2, "at index (0, 2)"),
    ("shape_rewards", _rewards_sign, "wrong", 1, "expected -0.05, got 0.05"),
]


def test_every_checker_is_tested_here():
    assert set(CHECKERS) == set(PACKAGE) == set(READERS)



def test_k3_computed_in_float64_and_cast_back_is_accepted():
    """The tolerances leave room for another correct formula, not only the package's."""
    assert verdict("k3", lambda d: (torch.expm1(-d.double()) + d.double()).to(d.dtype)).correct


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_the_stub_is_not_implemented_yet(name):
    result = verdict(name, _stub)
    assert result.status == "not implemented" and result.case is None
    assert result.message.startswith(f"{name}: not implemented yet")
    assert len(result.message) <= WIDTH


def test_an_exception_is_reported_with_its_input_not_raised():
    def broken(scores, per_token_kl, mask, beta):
        return per_token_kl[5]

    result = verdict("shape_rewards", broken)
    assert (result.status, result.case) == ("error", 1)
    assert result.message.startswith("shape_rewards: raised IndexError on hidden case 1 of 4")
    assert "  mask = tensor([[1, 1, 1], [1, 1, 1]], int64)" in result.message
    assert "IndexError: index 5 is out of bounds" in result.message


def test_check_prints_the_verdict_and_is_deterministic():
    outputs = []
    for _ in range(2):
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            check("k3", _k3_naive)
        outputs.append(buffer.getvalue())
    assert outputs[0] == outputs[1] == verdict("k3", _k3_naive).message + "\n"


def test_a_function_that_changes_its_input_cannot_change_the_cases():
    def in_place(log_ratio):
        log_ratio.mul_(0)  # the reader's own input, not the case nor the expected value
        return torch.expm1(-log_ratio) + log_ratio

    result = verdict("k3", in_place)
    assert result.status == "wrong" and "log_ratio = tensor([-2, -0.5, 0, 0.5, 2], float64)" in result.message
    assert verdict("k3", k3).correct


def test_warnings_inside_the_reader_s_function_are_not_shown(recwarn):
    def noisy(p, q):
        return float(np.sum(np.where(p > 0, p * np.log(p / q), 0.0)))  # warns about log 0, is right

    assert verdict("kl_divergence", noisy).correct
    assert not recwarn.list


def test_a_float32_result_is_compared_at_its_own_tolerance():
    case = CHECKERS["k3"].cases()[2]
    assert case.args["log_ratio"].dtype == torch.float32 and case.rtol > 1e-6


def test_register_checker_adds_and_refuses_a_duplicate(monkeypatch):
    monkeypatch.setattr(exr, "CHECKERS", dict(CHECKERS))

    @register_checker("double", lambda x: 2 * x, "00-test")
    def _cases():
        return [Case("two", {"x": 2.0})]

    assert verdict("double", lambda x: x + x).correct
    assert verdict("double", lambda x: x * x + 1).status == "wrong"
    with pytest.raises(ValueError, match="already registered"):
        register_checker("double", lambda x: x, "00-test")(_cases)


BAD = [
    ("unknown name", lambda: verdict("k4", k3), ValueError, r"no exercise checker named 'k4'.*'k3'"),
    ("name not a string", lambda: verdict(3, k3), TypeError, "name must be the exercise's checker name"),
    ("fn not callable", lambda: verdict("k3", 3.0), TypeError, "fn must be the function you wrote"),
    ("fn is the result, not the function", lambda: check("k3", k3(torch.zeros(2))), TypeError,
     "got Tensor"),
    ("register: empty name", lambda: register_checker("", k3, "x"), TypeError, "non-empty string"),
    ("register: reference not callable", lambda: register_checker("z", 1, "x"), TypeError, "reference"),
]


@pytest.mark.parametrize(("call", "exc", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments_raise_a_clear_error(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# --- sections 3, 6 and 1: their checkers, tested the same way (one block, appended) -------------------


def _seq_k1_reader(policy_logprobs, reference_logprobs, mask):
    return torch.where(mask.bool(), policy_logprobs - reference_logprobs, 0.0).sum(dim=-1)


def _seq_k1_no_mask(policy_logprobs, reference_logprobs, mask):  # the padding's log-ratios counted
    return (policy_logprobs - reference_logprobs).sum(dim=-1)


def _seq_k1_times_mask(policy_logprobs, reference_logprobs, mask):  # -inf - -inf = nan, and nan * 0 = nan
    return ((policy_logprobs - reference_logprobs) * mask).sum(dim=-1)


def _seq_k1_token_mean(policy_logprobs, reference_logprobs, mask):  # a per-token mean, not the sum
    return _seq_k1_reader(policy_logprobs, reference_logprobs, mask) / mask.sum(dim=-1)


def _seq_k1_sign(policy_logprobs, reference_logprobs, mask):  # log pi_ref - log pi
    return _seq_k1_reader(reference_logprobs, policy_logprobs, mask)


def _seq_k1_batch_total(policy_logprobs, reference_logprobs, mask):  # one number for the batch
    return _seq_k1_reader(policy_logprobs, reference_logprobs, mask).sum()


def _token_mean_reader(per_token_kl, mask):
    valid = mask.bool()
    return torch.where(valid, per_token_kl, 0.0).sum(dim=-1) / valid.sum(dim=-1)


def _token_mean_padded_width(per_token_kl, mask):  # divided by T, the padded width, not T_i
    return torch.where(mask.bool(), per_token_kl, 0.0).sum(dim=-1) / mask.shape[-1]


def _token_mean_sum(per_token_kl, mask):  # the sum, not the mean
    return torch.where(mask.bool(), per_token_kl, 0.0).sum(dim=-1)


def _token_mean_times_mask(per_token_kl, mask):  # nan * 0 = nan
    return (per_token_kl * mask).sum(dim=-1) / mask.sum(dim=-1)


def _token_mean_whole_batch(per_token_kl, mask):  # one ratio for the batch, sum S_i / sum T_i
    return torch.where(mask.bool(), per_token_kl, 0.0).sum() / mask.sum()


def _posterior_reader(ref_logprobs, reward, beta):
    logits = ref_logprobs + reward / beta
    return logits - torch.logsumexp(logits, dim=0)


def _posterior_in_probabilities(ref_logprobs, reward, beta):  # exp(r / beta) overflows: inf / inf
    p = ref_logprobs.exp() * torch.exp(reward / beta)
    return (p / p.sum()).log()


def _posterior_sign(ref_logprobs, reward, beta):  # e^{-r / beta}: the reward as a cost
    return _posterior_reader(ref_logprobs, -reward, beta)


def _posterior_unnormalised(ref_logprobs, reward, beta):  # log Z_beta left out
    return ref_logprobs + reward / beta


def _posterior_times_beta(ref_logprobs, reward, beta):  # r * beta: beta read as a weight on r
    return _posterior_reader(ref_logprobs, reward * beta * beta, beta)


SECTIONS_3_6_1_READERS = {"sequence_k1": _seq_k1_reader, "token_mean_kl": _token_mean_reader,
                          "optimal_policy": _posterior_reader}
SECTIONS_3_6_1_WRONG = [
    ("sequence_k1", _seq_k1_no_mask, "wrong", 2, "expected -0.7, got 1.1"),
    ("sequence_k1", _seq_k1_times_mask, "wrong", 4, "got nan"),
    ("sequence_k1", _seq_k1_token_mean, "wrong", 1, "expected 0.5, got 0.1666666667"),
    ("sequence_k1", _seq_k1_sign, "wrong", 1, "expected 0.5, got -0.5"),
    ("sequence_k1", _seq_k1_batch_total, "wrong", 1, "expected shape (2,), got shape ()"),
    ("token_mean_kl", _token_mean_padded_width, "wrong", 2, "expected 0.4, got 0.3"),
    ("token_mean_kl", _token_mean_sum, "wrong", 1, "expected 0.4, got 1.2"),
    ("token_mean_kl", _token_mean_times_mask, "wrong", 4, "got nan"),
    ("token_mean_kl", _token_mean_whole_batch, "wrong", 1, "expected shape (2,), got shape ()"),
    ("optimal_policy", _posterior_in_probabilities, "wrong", 3, "expected -499.306868, got nan"),
    ("optimal_policy", _posterior_sign, "wrong", 1, "expected -1.021774754, got -0.8363988511"),
    ("optimal_policy", _posterior_unnormalised, "wrong", 1, "got -0.6931471806"),
    ("optimal_policy", _posterior_times_beta, "wrong", 2, "expected -0.1457379425, got -1.895462939"),
]
PACKAGE.update({name: CHECKERS[name].reference for name in SECTIONS_3_6_1_READERS})
READERS.update(SECTIONS_3_6_1_READERS)
WRONG = [*WRONG, *SECTIONS_3_6_1_WRONG]


# --- sections 7, 8 and 9: one Ziegler update, a masked token mean, GAE ------------------------------------
# (the tables above are extended; the tests at the end of the file cover these checkers)


def _ziegler_reader(beta, kl, target_kl, n_steps, horizon):
    error = min(max(kl / target_kl - 1, -0.2), 0.2)
    return beta * max(1 + error * n_steps / horizon, 0.01)


def _ziegler_unclipped(beta, kl, target_kl, n_steps, horizon):  # the error not clipped
    return beta * max(1 + (kl / target_kl - 1) * n_steps / horizon, 0.01)


def _ziegler_ratio_inverted(beta, kl, target_kl, n_steps, horizon):  # target / KL - 1: the wrong way
    error = min(max(target_kl / kl - 1, -0.2), 0.2)
    return beta * max(1 + error * n_steps / horizon, 0.01)


def _ziegler_no_floor(beta, kl, target_kl, n_steps, horizon):  # the libraries' factor: can go negative
    error = min(max(kl / target_kl - 1, -0.2), 0.2)
    return beta * (1 + error * n_steps / horizon)


def _ziegler_additive(beta, kl, target_kl, n_steps, horizon):  # beta + e n/H: not multiplicative
    error = min(max(kl / target_kl - 1, -0.2), 0.2)
    return beta + error * n_steps / horizon


def _token_mean_reader(per_token_kl, mask):
    valid = mask.bool()
    total = torch.where(valid, per_token_kl, torch.zeros_like(per_token_kl)).sum(-1)
    return total / valid.sum(-1).clamp(min=1)


def _token_mean_no_mask(per_token_kl, mask):  # the pads' values counted, the mean over all T
    return per_token_kl.mean(-1)


def _token_mean_over_t(per_token_kl, mask):  # pads masked, but divided by all T positions
    return torch.where(mask.bool(), per_token_kl, torch.zeros_like(per_token_kl)).sum(-1) / mask.shape[-1]


def _token_mean_unmasked_sum(per_token_kl, mask):  # divided by the valid count, the pads still summed
    return per_token_kl.sum(-1) / mask.sum(-1).clamp(min=1)


def _token_mean_nan_when_empty(per_token_kl, mask):  # 0 / 0 for a response with no valid token
    return torch.where(mask.bool(), per_token_kl, torch.zeros_like(per_token_kl)).sum(-1) / mask.sum(-1)


def _token_mean_batch(per_token_kl, mask):  # one number for the batch, not one per response
    return torch.where(mask.bool(), per_token_kl, torch.zeros_like(per_token_kl)).sum() / mask.sum()


def _gae_reader(rewards, values, mask, gamma, lam):
    valid = mask.bool()
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    v = torch.where(valid, values, torch.zeros_like(values))
    advantages, running = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        next_value = v[:, t + 1] if t + 1 < r.shape[1] else torch.zeros_like(running)
        running = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * running
        advantages[:, t] = running
    return torch.where(valid, advantages, torch.zeros_like(advantages))


def _gae_no_mask(rewards, values, mask, gamma, lam):  # pads' rewards and values leak in; A masked at the end
    return _gae_reader(rewards, values, torch.ones_like(mask), gamma, lam) * mask


def _gae_forward(rewards, values, mask, gamma, lam):  # the recursion run forwards, A_t from A_{t-1}
    return torch.flip(_gae_reader(torch.flip(rewards, [1]), torch.flip(values, [1]),
                                  torch.flip(mask, [1]), gamma, lam), [1])



def _gae_lam_only(rewards, values, mask, gamma, lam):
    valid = mask.bool()
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    v = torch.where(valid, values, torch.zeros_like(values))
    advantages, running = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        next_value = v[:, t + 1] if t + 1 < r.shape[1] else torch.zeros_like(running)
        running = r[:, t] + gamma * next_value - v[:, t] + lam * running
        advantages[:, t] = running
    return torch.where(valid, advantages, torch.zeros_like(advantages))


PACKAGE_789 = {"ziegler_update": exr._ziegler_update, "token_mean": exr._token_mean, "gae": exr._gae}
READERS_789 = {"ziegler_update": _ziegler_reader, "token_mean": _token_mean_reader, "gae": _gae_reader}
WRONG_789 = [
    ("ziegler_update", _ziegler_unclipped, "wrong", 3, "got      0.33072"),
    ("ziegler_update", _ziegler_ratio_inverted, "wrong", 1, "KL 10 % above target"),
    ("ziegler_update", _ziegler_no_floor, "wrong", 6, "got      -0.08"),
    ("ziegler_update", _ziegler_additive, "wrong", 1, "expected 0.2010"),
    ("token_mean", _token_mean_no_mask, "wrong", 2, "at index 0"),
    ("token_mean", _token_mean_over_t, "wrong", 2, "at index 0: expected 0.3, got 0.18"),
    ("token_mean", _token_mean_unmasked_sum, "wrong", 2, "got      tensor([0.133333"),
    ("token_mean", _token_mean_nan_when_empty, "wrong", 5, "got nan"),
    ("token_mean", _token_mean_batch, "wrong", 1, "expected shape (2,), got shape ()"),
    ("gae", _gae_no_mask, "wrong", 3, "right padding"),
    ("gae", _gae_forward, "wrong", 1, "at index (0, 0)"),
    ("gae", _gae_lam_only, "wrong", 4, "gamma = 0.9"),
]
PACKAGE.update(PACKAGE_789)
READERS.update(READERS_789)
# a new list, not extend: the parametrisation above holds the old one (and its ids)
WRONG = WRONG + WRONG_789


def test_ziegler_update_matches_the_controller_over_a_run():
    """The reader's rule, applied update after update, is the controller's history."""
    from kltutorial.controllers import AdaptiveKLController

    controller, beta = AdaptiveKLController(0.1, 6.0, 1_000.0), 0.1
    for kl in (0.5, 3.0, 7.0, 12.0, 6.2, 5.1, 2.0):
        beta = _ziegler_reader(beta, kl, 6.0, 64, 1_000.0)
        assert beta == pytest.approx(controller.update(kl, 64), rel=1e-14)


# --- Sections 10, 11 and 12: trajectory_step, best_of_n_kl_bound, exact_kl (a self-contained block) -----


def _exact_kl_reader(z, w):
    log_p, log_q = z.log_softmax(-1), w.log_softmax(-1)
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def _exact_kl_kl_div(z, w):  # the usual F.kl_div recipe: 0 * (-inf - -inf) is nan
    return torch.nn.functional.kl_div(w.log_softmax(-1), z.log_softmax(-1), log_target=True,
                                      reduction="none").sum(-1)


def _exact_kl_log_of_softmax(z, w):  # guarded against p = 0, but log(softmax) underflows to -inf
    p, q = z.softmax(-1), w.softmax(-1)
    return torch.where(p > 0, p * (p.log() - q.log()), torch.zeros_like(p)).sum(-1)


def _exact_kl_swapped(z, w):  # KL(pi_ref || pi)
    return _exact_kl_reader(w, z)


def _exact_kl_not_summed(z, w):  # the terms, not their sum over the vocabulary
    log_p, log_q = z.log_softmax(-1), w.log_softmax(-1)
    return log_p.exp() * (log_p - log_q)


def _bound_reader(n):
    return float(np.log(n) - (n - 1) / n)


def _bound_log_n(n):  # the first term only
    return float(np.log(n))


def _bound_no_division(n):  # log n - (n - 1)
    return float(np.log(n) - (n - 1))


def _bound_log2(n):  # bits, not nats
    return float(np.log2(n) - (n - 1) / n)


def _step_reader(kl, beta, eps, noise_scale):
    return max(0.0, kl + 0.08 * (18 / (1 + 8 * beta) - kl) + noise_scale * eps)


def _step_no_floor(kl, beta, eps, noise_scale):  # the KL may go negative
    return kl + 0.08 * (18 / (1 + 8 * beta) - kl) + noise_scale * eps


def _step_equilibrium(kl, beta, eps, noise_scale):  # 18 / (1 + beta): the 8 forgotten
    return max(0.0, kl + 0.08 * (18 / (1 + beta) - kl) + noise_scale * eps)


def _step_unscaled_noise(kl, beta, eps, noise_scale):  # the kick not scaled by sigma
    return max(0.0, kl + 0.08 * (18 / (1 + 8 * beta) - kl) + eps)


_PACKAGE_10_12 = {"exact_kl": exr._exact_kl, "best_of_n_kl_bound": exr._best_of_n_kl_bound,
                  "trajectory_step": exr._trajectory_step}
_READERS_10_12 = {"exact_kl": _exact_kl_reader, "best_of_n_kl_bound": _bound_reader,
                  "trajectory_step": _step_reader}
_WRONG_10_12 = [
    ("exact_kl", _exact_kl_kl_div, "wrong", 3, "got      tensor([nan], float64)"),
    ("exact_kl", _exact_kl_log_of_softmax, "wrong", 5, "expected 1000, got inf"),
    ("exact_kl", _exact_kl_swapped, "wrong", 1, "first difference at index 0"),
    ("exact_kl", _exact_kl_not_summed, "wrong", 1, "expected shape (1,), got shape (1, 3)"),
    ("best_of_n_kl_bound", _bound_log_n, "wrong", 2, "expected 0.1931471806, got 0.6931471806"),
    ("best_of_n_kl_bound", _bound_no_division, "wrong", 2, "got -0.3068528194"),
    ("best_of_n_kl_bound", _bound_log2, "wrong", 2, "got 0.5"),
    ("trajectory_step", _step_no_floor, "wrong", 5, "expected 0, got -0.148"),
    ("trajectory_step", _step_equilibrium, "wrong", 1, "got 1.309090909"),
    ("trajectory_step", _step_unscaled_noise, "wrong", 2, "to 10 digits"),
]
PACKAGE.update(_PACKAGE_10_12)
READERS.update(_READERS_10_12)
WRONG = [*WRONG, *_WRONG_10_12]



# --- The real-text chapter: distinct_2 ------------------------------------------------------------------


def _distinct_2_reader(texts):
    from kltutorial.textrlhf.metrics import text_words

    pairs = [tuple(ws[i : i + 2]) for t in texts for ws in [text_words(t)] for i in range(len(ws) - 1)]
    return len(set(pairs)) / len(pairs)


def _distinct_2_across_texts(texts):  # joins the batch into one text: pairs across the seams
    from kltutorial.textrlhf.metrics import text_words

    ws = [w for t in texts for w in text_words(t)]
    pairs = [tuple(ws[i : i + 2]) for i in range(len(ws) - 1)]
    return len(set(pairs)) / len(pairs)


def _distinct_2_raw_split(texts):  # splits on spaces: "best," and "best" are different words
    pairs = [tuple(ws[i : i + 2]) for t in texts for ws in [t.split()] for i in range(len(ws) - 1)]
    return len(set(pairs)) / len(pairs)


def _distinct_2_per_text(texts):  # averages each text's own ratio
    from kltutorial.textrlhf.metrics import text_words

    ratios = []
    for t in texts:
        ws = text_words(t)
        pairs = [tuple(ws[i : i + 2]) for i in range(len(ws) - 1)]
        if pairs:
            ratios.append(len(set(pairs)) / len(pairs))
    return float(np.mean(ratios))


PACKAGE["distinct_2"] = exr._distinct_2
READERS["distinct_2"] = _distinct_2_reader
WRONG = [*WRONG,
         ("distinct_2", _distinct_2_across_texts, "wrong", 2, "expected 0.1666666667, got 0.125"),
         ("distinct_2", _distinct_2_raw_split, "wrong", 4, "expected 0.3333333333, got 1 "),
         ("distinct_2", _distinct_2_per_text, "wrong", 2, "expected 0.1666666667, got 0.6111111111")]



# --- every checker, each section's block included (so these run after the blocks extend the tables)


@pytest.mark.parametrize("name", sorted(PACKAGE))
def test_the_package_s_own_implementation_is_correct(name):
    result = verdict(name, PACKAGE[name])
    assert result.correct and result.case is None, result.message
    assert result.message == f"{name}: correct (all {len(CHECKERS[name].cases())} hidden cases)"


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_reader_s_correct_implementation_is_accepted(name):
    assert verdict(name, READERS[name]).correct


@pytest.mark.parametrize(("name", "wrong", "status", "case", "phrase"), WRONG,
                         ids=[f"{w[0]}-{w[1].__name__.lstrip('_')}" for w in WRONG])
def test_a_plausible_wrong_answer_is_rejected_on_the_case_that_exposes_it(name, wrong, status, case, phrase):
    result = verdict(name, wrong)
    assert (result.status, result.case) == (status, case), result.message
    assert not result.correct
    lines = result.message.splitlines()
    assert lines[0].startswith(f"{name}: wrong on hidden case {case} of ")
    assert any(line.lstrip().startswith("expected") for line in lines)
    assert any(line.lstrip().startswith("got") for line in lines)
    assert phrase in result.message, result.message
    assert all(len(line) <= WIDTH for line in lines), lines

