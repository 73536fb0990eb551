"""Tests of kltutorial.textrlhf.trl_run: the real-text run through TRL's RLOOTrainer with KLMonitorCallback,
its configuration (the book's algorithm set in TRL's fields), its records, the store, and the stored run of
the book checked against a run trained today."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest
import torch

from kltutorial._npz_store import read_npz_metadata
from kltutorial.textrlhf import TextTrainConfig, gold_reward
from kltutorial.textrlhf import trl_run as tt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STORED = pathlib.Path(__file__).resolve().parents[1] / "book" / "data" / "text-trl-run.npz"
LIVE_STEPS = 2


@pytest.fixture(scope="module")
def live() -> tt.TRLTextResult:
    """The book's run, its first steps only, trained today (the final policy measured on 16 responses)."""
    torch.set_num_threads(1)
    return tt.train_with_trl(tt.TRLTextConfig(steps=LIVE_STEPS), evaluate=16)


def test_the_defaults_are_the_books_own_runs_and_the_whole_batch_is_one_group() -> None:
    c, own = tt.TRLTextConfig(), TextTrainConfig()
    assert (c.beta, c.steps, c.batch_size, c.lr, c.max_new_tokens) == (
        own.beta, own.steps, own.batch_size, own.lr, own.max_new_tokens)
    assert c.group == c.batch_size


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"beta": -0.1}, "beta"), ({"steps": 0}, "steps"), ({"group": 1}, "group"),
    ({"group": 5}, "must divide batch_size"), ({"lr": 0.0}, "lr"), ({"max_new_tokens": 65}, "max_new_tokens"),
    ({"monitor_samples": 1}, "monitor_samples"), ({"seed": -1}, "seed"),
])
def test_config_rejects_bad_fields(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tt.TRLTextConfig(**kwargs)


def test_rloo_args_set_the_books_algorithm_in_trls_fields(tmp_path) -> None:
    c = tt.TRLTextConfig(beta=0.2, steps=7)
    args = tt.rloo_args(c, tmp_path)
    assert (args.beta, args.max_steps) == (0.2, 7)
    assert (args.per_device_train_batch_size, args.num_generations) == (64, 64)
    assert (args.learning_rate, args.max_completion_length, args.temperature) == (1e-3, 24, 1.0)
    assert args.lr_scheduler_type == "constant" and args.weight_decay == 0.0
    assert (args.max_grad_norm, args.num_iterations, args.normalize_advantages) == (1.0, 1, False)
    assert not args.bf16 and not args.activation_checkpointing and not args.gradient_checkpointing
    assert args.logging_steps == 1
    assert args.model_init_kwargs == {"dtype": torch.float32}
    with pytest.raises(TypeError, match="TRLTextConfig"):
        tt.rloo_args(TextTrainConfig(), tmp_path)


def test_the_reward_function_is_the_gold_reward_as_trl_calls_it() -> None:
    texts = ["i love this, it is the best.", "a terrible, awful day.", ""]
    got = tt.gold_reward_function(prompts=["<s>"] * 3, completions=texts, completion_ids=[[1], [2], []])
    assert got == gold_reward(texts).tolist() and got[0] > 0.5 > -0.5 > got[1] and got[2] == 0.0
    with pytest.raises(TypeError, match="completions"):
        tt.gold_reward_function(prompts=["<s>"], completions="one text")


def test_train_with_trl_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="TRLTextConfig"):
        tt.train_with_trl(TextTrainConfig())
    with pytest.raises(ValueError, match="evaluate"):
        tt.train_with_trl(tt.TRLTextConfig(steps=1), evaluate=0)


def test_a_run_records_trls_kl_and_the_callbacks_exact_kl_at_every_step(live: tt.TRLTextResult) -> None:
    assert live.trl_step.tolist() == [1, 2] and live.trl_policy_step.tolist() == [0, 1]
    assert live.monitor_step.tolist() == [0, 1, 2]
    assert set(live.monitor) == set(tt.MONITOR_KEYS)
    # The first batch comes from the policy before any update, the reference's own weights: every
    # log-ratio of TRL's and every exact KL of the callback's is 0.
    assert live.trl_kl[0] == 0.0 and live.monitor["exact_kl"][0] == 0.0
    assert np.all(np.diff(live.monitor["exact_kl"]) > 0)  # the policy leaves the reference
    assert np.all(live.trl_length > 1) and np.all(np.abs(live.trl_reward) < 1)
    # per token = the sum along a response over its tokens: the mean length lies between 1 and 24
    m = live.monitor
    assert np.all(m["exact_kl_per_token"][1:] < m["exact_kl"][1:])
    assert np.all(m["exact_kl_per_token"][1:] * 24 > m["exact_kl"][1:])
    assert len(live.samples) == 16 and live.final.kl > 0 and live.policy is not None


def test_a_run_reads_back_as_written(live: tt.TRLTextResult, tmp_path) -> None:
    path = tmp_path / "run.npz"
    tt.write_trl_run(live, path, command="test")
    back = tt.read_trl_run(path)
    for f in dataclasses.fields(tt.TRLTextResult):
        if f.name == "monitor":
            assert all(np.array_equal(back.monitor[k], live.monitor[k]) for k in tt.MONITOR_KEYS)
        elif f.name == "policy":
            assert back.policy is None
        elif f.name == "seconds":
            assert back.seconds == round(live.seconds, 1)
        else:
            a, b = getattr(back, f.name), getattr(live, f.name)
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, f.name
    meta = read_npz_metadata(path)
    assert meta["command"] == "test" and {"versions", "machine", "date"} <= set(meta)
    assert "trl" in meta["versions"]
    with pytest.raises(TypeError, match="TRLTextResult"):
        tt.write_trl_run({"trl_kl": live.trl_kl}, path)


def test_the_stored_run_is_what_the_code_trains(live: tt.TRLTextResult) -> None:
    """book/data/text-trl-run.npz, checked against the code: the first steps of the run trained again
    record what the stored run records. Bit for bit on the machine that wrote the file (one torch thread);
    on another CPU regenerate it with the command it records."""
    meta = read_npz_metadata(STORED)
    assert meta["command"] == "python -m kltutorial.textrlhf.trl_run book/data/text-trl-run.npz"
    stored = tt.read_trl_run(STORED)
    assert stored.config == tt.TRLTextConfig()
    n = LIVE_STEPS
    assert stored.trl_step.tolist() == list(range(1, stored.config.steps + 1))
    assert stored.monitor_step.tolist() == list(range(stored.config.steps + 1))
    gap = max(np.max(np.abs(live.trl_kl - stored.trl_kl[:n])),
              np.max(np.abs(live.monitor["exact_kl"] - stored.monitor["exact_kl"][: n + 1])))
    assert gap < 1e-4, (f"the first {n} steps trained today differ from the stored run by {gap:.3g} nats "
                        f"(stored on {meta['machine']}, {meta['date']}); if the code changed, regenerate: "
                        f"{meta['command']}")
