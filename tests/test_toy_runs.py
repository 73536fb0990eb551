"""kltutorial.studies.toy_runs: the stored toy runs read back bit for bit, the live check, the command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kltutorial import toyrlhf as toy
from kltutorial.studies import toy_runs
from kltutorial.toyrlhf import recipes

DATA = Path(__file__).resolve().parents[1] / "book" / "data"


@pytest.fixture(scope="module")
def task() -> toy.ToyTask:
    return toy_runs.book_task()


@pytest.fixture(scope="module")
def short_runs(task: toy.ToyTask) -> dict:
    control = toy_runs.control_runs(task, steps=6, names=["doubling rule"])
    recipe = toy_runs.recipe_runs(task, 0.3, steps=6, names=["rloo-k1-reward", "ppo-k1-reward"])
    return control | recipe


def test_runs_read_back_bit_for_bit(tmp_path: Path, task: toy.ToyTask, short_runs: dict) -> None:
    path = tmp_path / "runs.npz"
    toy_runs.write_runs(short_runs, path, command="python -m kltutorial.studies.toy_runs test")
    back = toy_runs.read_runs(path, task)
    assert list(back) == list(short_runs)
    for name, run in short_runs.items():
        got = back[name]
        assert type(got) is type(run)
        assert torch.equal(got.logprobs, run.logprobs) and got.logprobs.dtype == torch.float64
        fields = ("kl", "kl_sampled", "beta", "proxy", "gold") if isinstance(run, toy.TrainResult) \
            else ("steps", "kl", "proxy", "gold")
        for f in fields:
            assert np.array_equal(getattr(got, f), getattr(run, f)), (name, f)
        if isinstance(run, recipes.RecipeResult):
            assert (got.recipe, got.beta, got.group_size) == (run.recipe, run.beta, run.group_size)
            assert got.settings == run.settings and got.task is task
    meta = toy_runs.read_metadata(path)
    assert meta["command"] == "python -m kltutorial.studies.toy_runs test"
    assert [r["name"] for r in meta["runs"]] == list(short_runs)
    assert meta["versions"]["torch"] == torch.__version__ and meta["date"]


def test_a_run_of_twice_the_steps_repeats_the_first_half_exactly(task: toy.ToyTask, short_runs: dict) -> None:
    # what the pages' live check relies on: the learning rate is constant over the first half
    longer = toy_runs.control_runs(task, steps=12, names=["doubling rule"])["doubling rule"]
    assert toy_runs.largest_difference(longer, short_runs["doubling rule"], 4) == 0.0
    assert toy_runs.largest_difference(longer, short_runs["doubling rule"], 5) > 0.0  # decay differs
    again = toy_runs.recipe_runs(task, 0.3, steps=6, names=["rloo-k1-reward"])["rloo-k1-reward"]
    assert toy_runs.largest_difference(again, short_runs["rloo-k1-reward"], 6) == 0.0


def test_largest_difference_sees_a_changed_run(short_runs: dict) -> None:
    run = short_runs["doubling rule"]
    changed = toy.TrainResult(run.logprobs, run.kl + np.r_[0, 0, 1e-6, np.zeros(len(run.kl) - 3)],
                              run.kl_sampled, run.beta, run.proxy, run.gold)
    assert toy_runs.largest_difference(changed, run, 1) == 0.0
    assert toy_runs.largest_difference(changed, run, 2) == pytest.approx(1e-6)
    with pytest.raises(TypeError, match="both be TrainResult or both RecipeResult, got TrainResult and"):
        toy_runs.largest_difference(run, short_runs["rloo-k1-reward"], 2)
    with pytest.raises(ValueError, match="do not both record"):
        toy_runs.largest_difference(run, toy.TrainResult(run.logprobs, run.kl[:2], run.kl_sampled,
                                                         run.beta, run.proxy, run.gold), 4)


def test_seed_study_and_names(task: toy.ToyTask) -> None:
    with pytest.raises(ValueError, match="names must be among"):
        toy_runs.recipe_runs(task, 0.1, seeds=True, steps=2, names=["no-such-run"])
    with pytest.raises(ValueError, match="names must be among"):
        toy_runs.control_runs(task, steps=2, names=["pid"])
    name = toy_runs.seed_run_name(1, 2)
    run = toy_runs.recipe_runs(task, 0.1, seeds=True, steps=2, names=[name])[name]
    assert run.recipe == "ppo-k1-reward" and run.settings == recipes.PPOSettings(epochs=1)


def test_beta_sweep_names_and_betas(task: toy.ToyTask) -> None:
    with pytest.raises(ValueError, match=r"betas must be among \[1.0, "):
        toy_runs.beta_runs(task, steps=2, betas=[0.25])
    runs = toy_runs.beta_runs(task, steps=2, betas=[0.3])
    assert list(runs) == ["beta = 0.3"] == [toy_runs.beta_run_name(0.3)]
    assert runs["beta = 0.3"].beta[0] == 0.3


def test_transformer_runs_start_from_copies_of_the_network(task: toy.ToyTask) -> None:
    from kltutorial.toyrlhf.transformer import TransformerPolicy
    net = TransformerPolicy(task.space, generator=torch.Generator().manual_seed(0))
    before = [p.clone() for p in net.parameters()]
    runs = toy_runs.transformer_runs(task, net, names=["dr-grpo-k3-loss"], steps=2)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # untouched
    run = runs["dr-grpo-k3-loss"]
    with torch.no_grad():
        assert torch.equal(run.task.ref_table, recipes.with_reference(task, net.table()).ref_table)
    with pytest.raises(ValueError, match="names must be among"):
        toy_runs.transformer_runs(task, net, names=["grpo-k3-loss"])


def test_bad_input_is_named(tmp_path: Path, task: toy.ToyTask, short_runs: dict) -> None:
    with pytest.raises(TypeError, match=r"runs\['x'\] must be a TrainResult or a RecipeResult"):
        toy_runs.write_runs({"x": 1}, tmp_path / "x.npz")
    path = tmp_path / "ok.npz"
    toy_runs.write_runs(short_runs, path)
    with pytest.raises(TypeError, match="task must be a ToyTask"):
        toy_runs.read_runs(path, "book")
    run = short_runs["doubling rule"]
    toy_runs.write_runs({"small": toy.TrainResult(run.logprobs[:10], run.kl, run.kl_sampled, run.beta,
                                                  run.proxy, run.gold)}, path)
    with pytest.raises(ValueError, match="has 10 log-probs, task has 32768 sequences: not the runs' task"):
        toy_runs.read_runs(path, task)


def test_command_line_writes_what_it_names(tmp_path: Path, task: toy.ToyTask) -> None:
    path = tmp_path / "c.npz"
    toy_runs.main(["control", str(path), "--steps", "2"])
    meta = toy_runs.read_metadata(path)
    assert meta["command"] == f"python -m kltutorial.studies.toy_runs control {path} --steps 2"
    runs = toy_runs.read_runs(path, task)
    assert list(runs) == list(toy_runs.control_controllers(task)) and len(runs["doubling rule"].kl) == 2


@pytest.mark.parametrize("name, size", [
    ("toy-control-runs.npz", 6), ("toy-beta-runs.npz", len(toy.FIXED_BETAS)), ("toy-recipe-runs-0.3.npz", 9),
    ("toy-recipe-runs-0.1.npz", 14), ("toy-transformer-runs.npz", 2)])
def test_the_stored_files_are_the_books_sets(task: toy.ToyTask, name: str, size: int) -> None:
    meta = json.loads(json.dumps(toy_runs.read_metadata(DATA / name)))
    stem = name.removeprefix("toy-").removesuffix(".npz")
    kind = {"control-runs": "control", "beta-runs": "betas", "transformer-runs": "transformer"}.get(
        stem, stem.replace("recipe-runs", "recipes"))
    assert meta["command"] == f"python -m kltutorial.studies.toy_runs {kind} book/data/{name}"
    assert len(meta["runs"]) == size
    runs = toy_runs.read_runs(DATA / name, task)
    for run_name, run in runs.items():
        steps = (toy_runs.TRANSFORMER_BUDGET[run_name] if kind == "transformer" else
                 {"control": toy_runs.CONTROL_STEPS}.get(kind, toy.TrainConfig().steps))
        recorded = len(run.kl) if isinstance(run, toy.TrainResult) else int(run.steps[-1])
        assert recorded == steps
