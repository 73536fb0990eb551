"""Tests of kltutorial.studies.trl_runs, the command that writes book/data/trl-runs.json: a tiny version of
the book's runs end to end (distillation, TRL's trainers, the exact measurements, the callback), what the
file records, the tables the page prints from it, and the command line's errors."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import trl

from kltutorial.studies import trl_runs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny() -> dict:
    """Two of the book's runs, two steps of 16 completions each, from a network distilled for 2 steps."""
    grpo = replace(trl_runs.RUNS[0], steps=2, batch=16, monitor_every=1)  # TRL's defaults, with the callback
    rloo = replace(trl_runs.RUNS[-1], steps=2, batch=16)
    return trl_runs.run_all([grpo, rloo], distill_steps=2)


def test_the_runs_train_in_float32() -> None:
    for spec in trl_runs.RUNS:
        assert not trl_runs.make_args(spec, "/tmp/kltutorial-test").bf16


def test_run_all_records_the_versions_the_machine_and_the_date(tiny: dict) -> None:
    assert tiny["versions"]["trl"] == trl.__version__
    assert set(tiny["versions"]) == {"trl", "transformers", "torch"}
    assert "cores" in tiny["machine"] and len(tiny["date"]) == 10 and tiny["distill_steps"] == 2
    assert tiny["distill_kl"] > 0


def test_each_run_is_measured_against_every_candidate(tiny: dict) -> None:
    grpo, rloo = tiny["runs"]
    # TRL's GRPO default weights k3 by the ratio: the per-token reverse KL's point
    assert grpo["own"] == "reverse per-token" and rloo["own"] == "pi*_beta"
    assert set(grpo["kl_to"]) == {"pi*_beta", "forward per-token", "reverse per-token",
                                  "forward, other scaling", "reverse, other scaling"}
    assert set(rloo["kl_to"]) == {"pi*_beta", "forward per-token", "reverse per-token"}
    for r in (grpo, rloo):
        assert all(v >= 0 and math.isfinite(v) for v in r["kl_to"].values())
        assert r["kl_ref"] >= 0 and 0 <= r["off_task"] < 1 and r["steps"] == 2
        assert [rec["step"] for rec in r["log"]] and all("kl" in rec for rec in r["log"])
    # the callback measured before training and after each step (its history; the records carry the latest)
    assert [m["step"] for m in grpo["monitor"]] == [0, 1, 2] and "monitor" not in rloo
    assert all(m["exact_kl"] >= 0 for m in grpo["monitor"])


def test_the_tables_the_page_prints(tiny: dict) -> None:
    rows = [trl_runs.summary(r) for r in tiny["runs"]]
    assert [r["own"] for r in rows] == ["rev/group", "pi*"]
    for r in rows:
        assert r["to_own"] == r["kl_to"][r["own"]] and r["ratio"] == r["to_nearest"] / r["to_own"]
        assert r["nearest"] != r["own"] and r["to_nearest"] == min(v for k, v in r["kl_to"].items()
                                                                     if k != r["own"])
    table, outcomes = trl_runs.format_table(tiny), trl_runs.format_outcomes(tiny)
    assert table.splitlines()[1].startswith("GRPO 0.04 k3*ratio group") and "RLOO 0.05" in table
    assert all(len(line) <= 88 for line in (table + "\n" + outcomes).splitlines())
    assert len(re.findall(r"\.\d{3}\*", table)) == 2  # each run's own candidate, starred


def test_the_command_line_names_unknown_runs_and_the_results_read_back(tmp_path: Path, tiny: dict,
                                                                       capsys) -> None:
    with pytest.raises(SystemExit):
        trl_runs.main(["--only", "no-such-run"])
    assert "unknown names" in capsys.readouterr().err
    written, tables = tmp_path / "runs.json", tmp_path / "tables.npz"
    trl_runs.write_results(tiny, written, tables)
    back = trl_runs.read_results(written)
    assert "table" not in back["runs"][0] and "reference" not in back
    assert trl_runs.format_table(back) == trl_runs.format_table(tiny)
    assert trl_runs.format_outcomes(back) == trl_runs.format_outcomes(tiny)
    # the stored tables measure the runs again, without training, to the same numbers
    again = trl_runs.remeasure(back, tables)
    for before, after in zip(back["runs"], again["runs"], strict=True):
        assert after["own"] == before["own"]
        assert after["kl_to"] == pytest.approx(before["kl_to"], abs=1e-12)
    with pytest.raises(SystemExit):
        trl_runs.main(["--remeasure", "--json", str(written)])  # needs --tables too
    trl_runs.main(["--remeasure", "--json", str(written), "--tables", str(tables)])
    assert trl_runs.read_results(written)["runs"][0]["kl_to"] == pytest.approx(again["runs"][0]["kl_to"])
