"""Tests of kltutorial.integrations.trl: the toy model's exact distribution against a direct enumeration,
the reward function, every TRL configuration's fixed point against an independent backward induction and
against exact gradient ascent on TRL's own per-token loss, the bad configurations, the monitoring
callback's exact KL against the enumerated one, and the callback under two processes (accelerate)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
import transformers
import trl

from kltutorial import exact as ex
from kltutorial.exact.fixed_points import per_token_fixed_point
from kltutorial.integrations import trl as kt
from kltutorial.toyrlhf import recipes as R
from kltutorial.toyrlhf.recipes.fixed_points import loss_fixed_point_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def task(toy_task):
    return toy_task


@pytest.fixture(scope="module")
def small_model(task):
    return kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=1)


def _grpo(**kw) -> trl.GRPOConfig:
    base = dict(output_dir="/tmp/kltutorial-test", max_completion_length=5, beta=0.04, report_to="none",
                use_cpu=True)
    return trl.GRPOConfig(**{**base, **kw})


def _rloo(**kw) -> trl.RLOOConfig:
    base = dict(output_dir="/tmp/kltutorial-test", max_completion_length=5, beta=0.05, report_to="none",
                use_cpu=True, num_generations=8)
    return trl.RLOOConfig(**{**base, **kw})


# --- the model and its exact distribution ----------------------------------------------------------


def test_model_logprobs_equal_a_direct_enumeration(task, small_model) -> None:
    model, tok = small_model
    logp = kt.model_logprobs(model, tok, task)
    assert abs(float(torch.logsumexp(logp, 0))) < 1e-12
    idx = torch.arange(0, task.space.n_sequences, 97)  # 338 sequences, every prefix length covered
    seqs = task.space.sequences[idx]
    inputs = torch.cat([torch.full((len(idx), 1), tok.bos_token_id), seqs], dim=1)  # <s> y1 ... y5
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=inputs).logits.double(), -1)[:, :-1]  # (n, T, M)
    V = task.space.vocab_size
    task_lp = full[..., :V] - torch.logsumexp(full[..., :V], -1, keepdim=True)
    direct = task_lp.gather(-1, seqs.unsqueeze(-1)).squeeze(-1).sum(-1)
    assert torch.allclose(logp[idx], direct, atol=1e-5)
    tables = kt.model_tables(model, tok, task)
    off = 1 - full[..., :V].exp().sum(-1)  # the mass off the task's tokens at each position
    prefix_rows = task.space.prefix_ids[idx]
    assert torch.allclose(tables.off_task[prefix_rows], off, atol=1e-6)
    assert 0 < tables.max_off_task < 1


def test_distill_fits_the_reference(task) -> None:
    model, tok = kt.toy_model(task, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    before = ex.sequence_kl(task.ref_logprobs, kt.model_logprobs(model, tok, task))
    kl = kt.distill(model, tok, task, steps=40, lr=1e-2)
    after = ex.sequence_kl(task.ref_logprobs, kt.model_logprobs(model, tok, task))
    assert kl < before / 5 and after <= kl + 1e-9  # renormalising over the task's tokens only lowers it


def test_the_tokenizer_maps_the_task_tokens_to_their_ids(task, small_model) -> None:
    _, tok = small_model
    assert tok("<s>", add_special_tokens=False).input_ids == [tok.bos_token_id]
    assert tok("a b !", add_special_tokens=False).input_ids == [0, 1, 7]
    assert tok.decode([0, 7, tok.eos_token_id], skip_special_tokens=True) == "a !"


def test_reward_function_reads_the_completion_ids(task) -> None:
    proxy, gold = kt.reward_function(task), kt.reward_function(task, "gold")
    ids = [[0, 0, 0, 0, 1], [7, 7, 7, 7, 7], [0, 1], [0, 1, 2, 3, 9]]
    got = proxy(prompts=["<s>"] * 4, completions=[""] * 4, completion_ids=ids)
    assert got[:2] == [float(task.proxy_reward[1]), float(task.proxy_reward[-1])]
    assert got[2:] == [kt.OFF_TASK_REWARD] * 2
    assert gold(completion_ids=[[7, 7, 7, 7, 7]]) == [float(task.gold_reward[-1])]
    assert kt.OFF_TASK_REWARD < float(task.proxy_reward.min())
    with pytest.raises(ValueError, match="completion_ids"):
        proxy(prompts=["<s>"], completions=["a"])


# --- where each configuration stops --------------------------------------------------------------


def _independent_backward_induction(space, ref_table, scores, c: float, divergence: str) -> torch.Tensor:
    """The per-token fixed point solved another way: reverse in closed form, forward by Newton's method from
    the left on lambda in sum_b c rho_b / (lambda - Q_b) = 1, one prefix level at a time."""
    V = space.vocab_size
    out = torch.empty_like(ref_table)
    value = scores.clone()
    for L in range(space.length - 1, -1, -1):
        lo, hi = space.offsets[L], space.offsets[L + 1]
        q, rho = value.reshape(-1, V), ref_table[lo:hi].exp()
        if divergence == "reverse":
            w = rho * torch.exp((q - q.max(-1, keepdim=True).values) / c)
            p = w / w.sum(-1, keepdim=True)
        else:
            q_max, arg = q.max(-1, keepdim=True)
            lam = q_max + c * rho.gather(-1, arg)  # f >= 0 here, and f is convex: Newton rises to the root
            for _ in range(200):
                f = (c * rho / (lam - q)).sum(-1, keepdim=True) - 1
                df = -(c * rho / (lam - q) ** 2).sum(-1, keepdim=True)
                lam = lam - f / df
            p = c * rho / (lam - q)
            p = p / p.sum(-1, keepdim=True)
        out[lo:hi] = p.log()
        value = (p * q).sum(-1)
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_unscaled_grpo_fixed_point_matches_independent_backward_induction(task, bias: bool) -> None:
    args = _grpo(scale_rewards="none", use_bias_correction_kl=bias, num_generations=8)
    got = kt.fixed_point(task, args)
    divergence = "reverse" if bias else "forward"
    table = _independent_backward_induction(task.space, task.ref_table, task.proxy_reward, 0.04 * 8 / 7,
                                            divergence)
    assert torch.allclose(got, ex.sequence_logprobs(task.space, table), atol=1e-9)


def test_the_default_grpo_config_stops_at_the_reverse_group_scaled_point(task) -> None:
    args = _grpo()  # TRL 1.16's defaults but beta: use_bias_correction_kl=True, scale_rewards="group"
    assert args.use_bias_correction_kl and args.scale_rewards == "group" and args.loss_type == "dapo"
    got = kt.fixed_point(task, args)
    want = R.fixed_point_table(task.space, task.ref_table, task.proxy_reward, "grpo-k3-loss", 0.04,
                               group_size=8)  # the forward one: what DeepSeekMath's GRPO stops at
    forward = ex.sequence_logprobs(task.space, want)
    assert ex.sequence_kl(got, forward) > 0.05  # the default does not stop at DeepSeekMath's point
    off = kt.fixed_point(task, _grpo(use_bias_correction_kl=False))
    assert torch.allclose(off, forward)
    # self-consistent: the reverse fixed point of GRPO's expected advantage at the point is the point
    curve = R.group_advantage_curve(task.proxy_reward, got, 8)
    again = per_token_fixed_point(task.space, task.ref_table, curve, 0.04, "reverse")
    assert torch.allclose(got, ex.sequence_logprobs(task.space, again), atol=1e-8)


def test_batch_scaled_fixed_point_is_self_consistent(task) -> None:
    args = _grpo(scale_rewards="batch", use_bias_correction_kl=False, beta=0.1)
    got = kt.fixed_point(task, args)
    table = ex.next_token_logprobs(task.space, got)
    sigma = R.score_std(task.space, table, task.proxy_reward)
    again = _independent_backward_induction(task.space, task.ref_table, task.proxy_reward,
                                            0.1 * 8 / 7 * (sigma + 1e-4), "forward")
    assert torch.allclose(got, ex.sequence_logprobs(task.space, again), atol=1e-8)


def test_rloo_stops_at_the_optimum_whatever_the_normalisation(task) -> None:
    want = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, 0.05)
    for normalize in (False, True):
        assert torch.allclose(kt.fixed_point(task, _rloo(normalize_advantages=normalize)), want)


def test_loss_type_and_iterations_do_not_move_the_point(task) -> None:
    ref = kt.fixed_point(task, _grpo(scale_rewards="none"))  # unscaled: the mapping, quickly
    for kw in ({"loss_type": "grpo"}, {"loss_type": "dr_grpo"}, {"loss_type": "bnpo"}, {"num_iterations": 4},
               {"epsilon": 0.3}):
        assert torch.equal(kt.fixed_point(task, _grpo(scale_rewards="none", **kw)), ref), kw


def _trl_expected_loss(space, theta, old_logits, ref_table, advantage, beta, bias: bool) -> torch.Tensor:
    """TRL's per-token GRPO loss (-A r_t + beta k3_t [r_t]), its expectation over every sequence drawn from
    the old policy: sum_y pi_old(y) sum_t (...), differentiable in theta at theta = old."""
    old = torch.log_softmax(old_logits, -1)
    new = torch.log_softmax(theta, -1)
    tok_new = ex.token_logprobs(space, new)  # (N, T)
    tok_old = ex.token_logprobs(space, old).detach()
    tok_ref = ex.token_logprobs(space, ref_table)
    ratio = torch.exp(tok_new - tok_old)
    k3 = torch.exp(tok_ref - tok_new) - (tok_ref - tok_new) - 1
    per_token = -advantage[:, None] * ratio + beta * (k3 * ratio if bias else k3)
    weight = tok_old.sum(-1).exp()  # pi_old(y)
    return (weight[:, None] * per_token).sum()


@pytest.mark.parametrize("bias,scale", [(True, "none"), (False, "none"), (True, "group")])
def test_exact_gradient_descent_on_trls_loss_reaches_the_fixed_point(bias: bool, scale: str) -> None:
    gen = torch.Generator().manual_seed(4)
    space = ex.SequenceSpace(vocab_size=3, length=2)
    ref = torch.log_softmax(torch.randn(space.n_prefixes, 3, generator=gen, dtype=torch.float64), -1)
    scores = torch.randn(space.n_sequences, generator=gen, dtype=torch.float64)
    beta, G = 0.5, 4
    target = loss_fixed_point_table(space, ref, scores, beta, divergence="reverse" if bias else "forward",
                                    group_size=G, scale=scale)
    logits = ref.clone()
    for _ in range(5000):
        logp = ex.sequence_logprobs(space, torch.log_softmax(logits, -1))
        if scale == "none":
            adv = (G - 1) / G * scores  # the group mean's expected effect (the module docstring)
        else:
            adv = R.group_advantage_curve(scores, logp, G)
        theta = logits.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(_trl_expected_loss(space, theta, logits, ref, adv, beta, bias), theta)
        logits = logits - 4.0 * grad  # each prefix is weighed by its mass: rare rows need a large step
    reached = ex.sequence_logprobs(space, torch.log_softmax(logits, -1))
    kl = ex.sequence_kl(reached, ex.sequence_logprobs(space, target))
    assert kl < 1e-8, kl  # the group curve is a quadrature, settled to 1e-10 in the advantage
    other = loss_fixed_point_table(space, ref, scores, beta, divergence="forward" if bias else "reverse",
                                   group_size=G, scale=scale)
    assert ex.sequence_kl(reached, ex.sequence_logprobs(space, other)) > 1e-4  # the weighting matters


@pytest.mark.parametrize("args,match", [
    (lambda: _grpo(beta=0.0), "beta"),
    (lambda: _grpo(temperature=0.7), "temperature"),
    (lambda: _grpo(top_k=5), "top_k"),
    (lambda: _grpo(top_p=0.9), "top_p"),
    (lambda: _grpo(max_completion_length=512), "max_completion_length"),
    (lambda: _grpo(loss_type="cispo"), "loss_type"),
    (lambda: _grpo(importance_sampling_level="sequence"), "importance_sampling_level"),
    (lambda: _grpo(top_entropy_quantile=0.2), "top_entropy_quantile"),
    (lambda: _grpo(mask_truncated_completions=True), "mask_truncated_completions"),
    (lambda: _grpo(sync_ref_model=True), "sync_ref_model"),
    (lambda: _rloo(reward_clip_range=(-1.0, 1.0)), "reward_clip_range"),
    (lambda: _rloo(temperature=0.5), "temperature"),
    (lambda: _grpo(use_adaptive_entropy=True), "use_adaptive_entropy"),
    (lambda: _grpo(entropy_coef=0.01), "entropy_coef"),
    (lambda: _grpo(min_p=0.05), "min_p"),
    (lambda: _grpo(repetition_penalty=1.2), "repetition_penalty"),
    (lambda: _grpo(off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),
    (lambda: _grpo(use_transformers_continuous_batching=True), "use_transformers_continuous_batching"),
    (lambda: _grpo(weight_decay=0.1), "weight_decay"),
    (lambda: _rloo(weight_decay=0.1), "weight_decay"),
    (lambda: _rloo(use_vllm=True), "use_vllm"),
    *[(lambda key=key, value=value: _grpo(generation_kwargs={key: value}), "generation_kwargs")
      for key, value in (("temperature", 0.7), ("top_k", 10), ("top_p", 0.9), ("min_p", 0.1),
                         ("repetition_penalty", 1.1), ("no_repeat_ngram_size", 2), ("typical_p", 0.9),
                         ("suppress_tokens", [0]), ("eos_token_id", 0))],
    *[(lambda key=key, value=value: _rloo(generation_kwargs={key: value}), "generation_kwargs")
      for key, value in (("temperature", 0.7), ("top_k", 10))],
])
def test_fixed_point_names_the_setting_it_cannot_compute(task, args, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kt.fixed_point(task, args())


def test_fixed_point_accepts_neutral_generation_kwargs(task) -> None:
    ref = kt.fixed_point(task, _grpo(scale_rewards="none"))
    args = _grpo(scale_rewards="none", generation_kwargs={"use_cache": True, "output_scores": False})
    assert torch.equal(kt.fixed_point(task, args), ref)


def test_every_config_field_is_classified_and_documented() -> None:
    """Each field TRL adds to TrainingArguments is modelled, refused, path or inert, and named in
    fixed_point's docstring (a TRL upgrade that adds a field fails here until it is read)."""
    doc = kt.fixed_point.__doc__
    for cfg in (_grpo(), _rloo()):
        for name in kt._own_fields(cfg):
            assert name in kt.CONFIG_FIELDS, f"{type(cfg).__name__}.{name} is not classified"
            named = f"``{name}``" in doc or (name.startswith("vllm_") and "``vllm_*``" in doc)
            assert named, f"{name} is not in fixed_point's docstring"
    assert {f.role for f in kt.CONFIG_FIELDS.values()} == {"modelled", "path", "inert"}


def test_a_field_trl_did_not_have_is_refused_unless_default(task, monkeypatch) -> None:
    args = _grpo(scale_rewards="none")
    monkeypatch.delitem(kt.CONFIG_FIELDS, "epsilon")  # as if TRL had added it after 1.16
    assert torch.equal(kt.fixed_point(task, args), kt.fixed_point(task, _grpo(scale_rewards="none")))
    with pytest.raises(ValueError, match="epsilon.*does not know"):
        kt.fixed_point(task, _grpo(scale_rewards="none", epsilon=0.3))


def test_fixed_point_rejects_other_arguments(task) -> None:
    with pytest.raises(TypeError, match="GRPOConfig or trl.RLOOConfig"):
        kt.fixed_point(task, {"beta": 0.1})
    with pytest.raises(ValueError, match="multiple of num_heads"):
        kt.toy_model(task, hidden_size=10, num_heads=4)
    with pytest.raises(TypeError, match="causal LM"):
        kt.model_logprobs(object(), None, task)


def test_candidates_hold_the_configurations_own_point(task) -> None:
    args = _grpo(use_bias_correction_kl=False)
    cands = kt.fixed_point_candidates(task, args)
    assert {"optimum", "forward/group", "reverse/group", "forward/none", "reverse/none"} <= set(cands)
    assert torch.equal(cands["forward/group"], kt.fixed_point(task, args))


# --- the monitoring callback ---------------------------------------------------------------------


class _StubTrainer:
    """What the callback reads of a trainer: its model, reference, tokenizer and log."""

    def __init__(self, model, ref, tok) -> None:
        self.model, self.ref_model, self.processing_class = model, ref, tok
        self.logged: list[dict] = []

    def log(self, logs: dict) -> None:
        self.logged.append(dict(logs))


def test_the_callbacks_exact_kl_is_the_enumerated_one(task) -> None:
    policy, tok = kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=2)
    ref, _ = kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=3)
    trainer = _StubTrainer(policy, ref, tok)
    cb = kt.KLMonitorCallback(trainer, ["<s>"], samples_per_prompt=400, max_new_tokens=5, every=1, seed=7)
    sample = cb.sample(0)
    tp, tq = kt.model_tables(policy, tok, task).full, kt.model_tables(ref, tok, task).full
    seq_ok = sample.mask.all(-1)  # the completions that did not stop early
    tokens = sample.tokens
    assert seq_ok.float().mean() > 0.5
    V, o = task.space.vocab_size, task.space.offsets
    n_checked = 0
    for i in torch.nonzero(seq_ok).flatten().tolist():
        code = 0
        for t in range(5):
            row = o[t] + code
            p, q = tp[row].exp(), tq[row]
            kl = float((p * (tp[row] - q)).sum())
            h = float(-(p * tp[row]).sum())
            assert sample.kl[i, t] == pytest.approx(kl, abs=1e-6)
            assert sample.entropy[i, t] == pytest.approx(h, abs=1e-6)
            y = int(tokens[i, t])
            if y >= V:
                break
            assert sample.policy[i, t] == pytest.approx(float(tp[row, y]), abs=1e-6)
            assert sample.reference[i, t] == pytest.approx(float(tq[row, y]), abs=1e-6)
            code = code * V + y
            n_checked += 1
    assert n_checked > 500  # positions before any special token (a random network samples them)
    stats = cb.statistics(sample)
    assert stats == kt.monitor_statistics(sample.policy, sample.reference, sample.kl, sample.entropy,
                                          sample.mask)
    # over the whole distribution: the sampled mean of sum_t KL_t estimates the sequence KL without bias
    exact = ex.sequence_kl(ex.sequence_logprobs(task.space, kt.model_tables(policy, tok, task).table),
                           ex.sequence_logprobs(task.space, kt.model_tables(ref, tok, task).table))
    assert abs(stats["exact_kl"] - exact) < 5 * stats["exact_kl_se"] + 0.05
    assert abs(stats["check_z"]) < 5 and math.isfinite(stats["gap_z"])
    cb.on_step_end(None, type("S", (), {"global_step": 1})(), None)
    assert not trainer.logged  # the callback writes no record of its own
    trainer.log({"loss": 0.5})  # the trainer's next record carries its numbers
    keys = {f"kltutorial/{k}" for k in stats} | {"kltutorial/step", "kltutorial/temperature",
                                                 "kltutorial/sampler_differs"}
    assert set(trainer.logged[0]) == {"loss"} | keys and trainer.logged[0]["kltutorial/step"] == 1
    trainer.log({"loss": 0.25})  # once only
    assert trainer.logged[1] == {"loss": 0.25}
    assert cb.history[0]["step"] == 1


def test_sampling_leaves_the_random_stream_and_the_mode_alone(task, small_model) -> None:
    model, tok = small_model
    cb = kt.KLMonitorCallback(_StubTrainer(model, model, tok), ["<s>"], samples_per_prompt=8,
                              max_new_tokens=5)
    model.train()
    state = torch.get_rng_state()
    first = cb.sample(3)
    assert torch.equal(torch.get_rng_state(), state) and model.training
    model.eval()
    assert torch.equal(cb.sample(3).tokens, first.tokens) and not model.training  # seeded by the step
    assert not torch.equal(cb.sample(4).tokens, first.tokens)


def test_the_checkpoints_generation_config_does_not_reach_the_samples(task) -> None:
    """A checkpoint whose generation_config sets a repetition penalty and min-p: the callback's samples are
    the same as without them (it samples the softmax itself), and it says that the trainer's differ."""
    policy, tok = kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=2)
    plain = kt.KLMonitorCallback(_StubTrainer(policy, policy, tok), ["<s>"], samples_per_prompt=64,
                                 max_new_tokens=5, seed=5).sample(0)
    policy.generation_config.repetition_penalty = 1.5
    policy.generation_config.min_p = 0.2
    with pytest.warns(UserWarning, match="repetition_penalty=1.5, .*min_p=0.2|min_p=0.2.*repetition_penalty"):
        cb = kt.KLMonitorCallback(_StubTrainer(policy, policy, tok), ["<s>"], samples_per_prompt=64,
                                  max_new_tokens=5, seed=5)
    assert torch.equal(cb.sample(0).tokens, plain.tokens)
    cb._monitor(0)
    assert cb._pending["kltutorial/sampler_differs"] == 1.0
    # a TRL trainer sets repetition_penalty=1.0 itself, and leaves min_p to the checkpoint
    trainer = _StubTrainer(policy, policy, tok)
    trainer.generation_config = transformers.GenerationConfig(repetition_penalty=1.0, top_k=0, top_p=1.0)
    assert kt.sampler_differences(trainer) == ["min_p=0.2"]


def test_the_callback_measures_the_trainers_temperature(task) -> None:
    policy, tok = kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=2)
    ref, _ = kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=3)
    trainer = _StubTrainer(policy, ref, tok)
    trainer.args = type("Args", (), {"temperature": 0.5})()
    cb = kt.KLMonitorCallback(trainer, ["<s>"], samples_per_prompt=32, max_new_tokens=5)
    sample = cb.sample(0)
    inputs = torch.cat([torch.full((32, 1), tok.bos_token_id), sample.tokens], dim=1)
    with torch.no_grad():
        lp = torch.log_softmax(policy(input_ids=inputs).logits[:, :-1].double() / 0.5, -1)
        lq = torch.log_softmax(ref(input_ids=inputs).logits[:, :-1].double() / 0.5, -1)
    m = sample.mask
    want = lp.gather(-1, sample.tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(sample.policy[m], want[m], atol=1e-6)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    assert torch.allclose(sample.kl[m], kl[m], atol=1e-6)
    cb._monitor(0)
    assert cb._pending["kltutorial/temperature"] == 0.5


def _trl_records(kind: str, model_dir: str, tok, task, every: int | None) -> list[dict]:
    import datasets

    cfg = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4,
               max_completion_length=5, max_steps=6, learning_rate=1e-2, beta=0.05, logging_steps=3,
               report_to="none", use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True)
    args = (trl.GRPOConfig if kind == "grpo" else trl.RLOOConfig)(**cfg)
    data = datasets.Dataset.from_dict({"prompt": [tok.bos_token] * 64})
    cls = trl.GRPOTrainer if kind == "grpo" else trl.RLOOTrainer
    trainer = cls(model=model_dir, reward_funcs=kt.reward_function(task), args=args, train_dataset=data,
                  processing_class=tok)
    trainer.model.generation_config.repetition_penalty = 1.3  # as some released checkpoints set
    if every is not None:
        trainer.add_callback(kt.KLMonitorCallback(trainer, [tok.bos_token], samples_per_prompt=16,
                                                  max_new_tokens=5, every=every))
    trainer.train()
    return trainer.state.log_history


_TIMINGS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


@pytest.fixture(scope="module")
def saved_model(task, tmp_path_factory):
    directory = tmp_path_factory.mktemp("toy")
    model, tok = kt.toy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory), tok


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_a_trl_run_logs_the_same_records_with_the_callback(task, saved_model, kind: str) -> None:
    """A 6-step run, logging every 3 steps: with the callback at every = 3 and every = 2, each record the
    trainer writes is the one it writes without it (loss, grad_norm, TRL's kl ...), plus the callback's keys
    on the training records; only timings differ."""
    model_dir, tok = saved_model
    base = _trl_records(kind, model_dir, tok, task, None)
    assert [r["step"] for r in base] == [3, 6, 6] and "loss" in base[0] and "kl" in base[0]
    for every in (3, 2):
        records = _trl_records(kind, model_dir, tok, task, every)
        assert len(records) == len(base)
        for without, with_ in zip(base, records, strict=True):
            ours = {k for k in with_ if k.startswith("kltutorial/")}
            assert set(with_) - ours == set(without), every
            for k, v in without.items():
                if k not in _TIMINGS:
                    assert with_[k] == v or (v != v and with_[k] != with_[k]), (every, k, with_[k], v)
        monitored = [r.get("kltutorial/step") for r in records]
        assert monitored == ([3, 6, None] if every == 3 else [2, 6, None])


def test_the_callback_rejects_bad_input(task, small_model) -> None:
    model, tok = small_model
    with pytest.raises(ValueError, match="reference"):
        kt.KLMonitorCallback(_StubTrainer(model, None, tok), ["<s>"])
    with pytest.raises(ValueError, match="prompts"):
        kt.KLMonitorCallback(_StubTrainer(model, model, tok), "<s>")
    with pytest.raises(ValueError, match="every"):
        kt.KLMonitorCallback(_StubTrainer(model, model, tok), ["<s>"], every=0)
    with pytest.raises(TypeError, match="Trainer"):
        kt.KLMonitorCallback(object(), ["<s>"])
    sharded = _StubTrainer(model, model, tok)  # FSDP: a rank cannot generate alone
    sharded.accelerator = type("A", (), {"state": type("S", (), {"fsdp_plugin": object()})()})()
    with pytest.raises(ValueError, match="FSDP"):
        kt.KLMonitorCallback(sharded, ["<s>"])


def test_a_rank_without_prompts_samples_nothing(task, small_model) -> None:
    """More processes than prompts: the rank that holds none returns empty (0, T) tensors to gather."""
    model, tok = small_model
    cb = kt.KLMonitorCallback(_StubTrainer(model, model, tok), ["<s>"], samples_per_prompt=4,
                              max_new_tokens=5)
    cb.trainer.accelerator = type("A", (), {"process_index": 1, "num_processes": 2,
                                            "unwrap_model": staticmethod(lambda m: m)})()
    empty = cb.sample(0)
    assert empty.policy.shape == (0, 5) and empty.mask.dtype == torch.bool


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_gather_what_one_process_computes(tmp_path: Path) -> None:
    """A short GRPOTrainer run with the callback under `accelerate launch --num_processes 2` (gloo, CPU):
    the statistics every rank logs equal one process's on the two ranks' completions put together."""
    script = ROOT / "tests" / "fixtures" / "trl_two_processes.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # --multi_gpu is accelerate's torch.distributed launcher; on a machine without GPUs its processes use gloo
    # (--cpu would start one process)
    files = ("rank0.pt", "rank1.pt", "log0.json", "log1.json")
    for attempt in (1, 2):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(script), str(tmp_path)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        # every rank writes its files as its last step: a crash after that is the process group's teardown
        # (see studies.diagnostics.spawn_ranks), not the run's
        written = [name for name in files if (tmp_path / name).exists()]
        if done.returncode == 0 or len(written) == len(files):
            break
        # Each rank's own error, not only the launcher's tail (which hides the rank that failed first).
        errors = "\n".join(line for line in done.stderr.splitlines()
                           if "Error" in line or "error" in line)[-6000:] or done.stderr[-4000:]
        if written or attempt == 2:
            pytest.fail(f"the two-process run failed (attempt {attempt}, files written: {written}):\n"
                        f"{errors}")
        # Nothing written: the process group did not form (gloo on loopback beside other tests' process
        # groups lost a connection once in a CI run, before training began). Once more, said aloud.
        warnings.warn(f"the two-process run failed before any rank wrote a file; started again:\n{errors}",
                      stacklevel=1)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for r in ranks:
        assert r["world"] == 2 and len(r["history"]) >= 2
    for step in range(len(ranks[0]["history"])):
        parts = [r["samples"][step] for r in ranks]
        joined = [torch.cat([p[k] for p in parts]) for k in range(5)]
        one = kt.monitor_statistics(*joined[:4], joined[4].bool())
        for r in ranks:
            logged = {k: v for k, v in r["history"][step].items() if k != "step"}
            assert logged.keys() == one.keys()
            for k, v in one.items():
                same = (math.isnan(v) and math.isnan(logged[k])) or logged[k] == pytest.approx(v, abs=1e-12)
                assert same, (k, logged[k], v)
        # three prompts over two ranks: rank 0 sampled two of them, rank 1 one, all three were gathered
        assert [len(p[0]) for p in parts] == [2 * 24, 24]
    assert json.loads((tmp_path / "log0.json").read_text())  # TRL's own log held the callback's records
