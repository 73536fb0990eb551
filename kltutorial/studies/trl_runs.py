r"""TRL's ``GRPOTrainer`` and ``RLOOTrainer`` trained on the toy task, each run measured against the exact
point its configuration stops at (book section 9, "The same recipes in TRL").

One network (:func:`~kltutorial.integrations.trl.toy_model`, distilled to the task's reference) starts
every run; the fixed points are taken relative to it (:func:`~kltutorial.toyrlhf.recipes.with_reference`
of its next-token table). Each run reports, exactly, the KL from the trained network's distribution to
its own configuration's fixed point and to every other candidate, its KL to the reference, and its
expected proxy and gold rewards. The runs take minutes, so the book reads their results from
``book/data/trl-runs.json``, written by::

    python -m kltutorial.studies.trl_runs --json book/data/trl-runs.json \
        --tables book/data/trl-runs-tables.npz

(about an hour on one core; ``--remeasure`` measures the stored networks again, without training, after
a change to the fixed points),
and :func:`run` is what the page also calls, live, for one short run.

**Precision.** The runs train in float32 (``bf16=False``; TRL's default is bf16 autocast, on also with
``use_cpu=True``), and each trained network's distribution is enumerated in float64 from float32, outside
autocast; :func:`precision_effect` measures what reading it under bf16 autocast would change.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import exact as ex
from ..integrations import trl as kt
from ..toyrlhf.recipes import with_reference
from ..toyrlhf.task import ToyTask
from .toy_runs import book_task

__all__ = ["TRLRun", "RUNS", "distilled_model", "make_args", "run", "run_all", "read_results",
           "summary", "label", "CANDIDATES", "format_table", "format_outcomes", "precision_effect",
           "measure_candidates", "write_results", "remeasure", "main"]


@dataclass(frozen=True)
class TRLRun:
    """One TRL configuration to train: the trainer, β, and for GRPO the KL's weighting and the scaling."""

    name: str
    trainer: str  # "grpo" or "rloo"
    beta: float
    bias_correction: bool = True  # GRPOConfig.use_bias_correction_kl (TRL's default: True)
    scale_rewards: str = "group"  # GRPOConfig.scale_rewards (TRL's default: "group")
    steps: int = 400
    batch: int = 256  # completions per step
    group: int = 8  # num_generations (GRPO's default 8; RLOO's default is 2)
    lr: float = 3e-3
    monitor_every: int = 0  # steps between KLMonitorCallback's logs (0: no callback)
    iterations: int = 1  # num_iterations: passes over each batch (TRL's default 1)
    extra: dict = field(default_factory=dict)


#: The book's runs: GRPO with both KL weightings at DeepSeekMath's β = 0.04 and at 0.1, with and without
#: the std scaling, TRL's default again with two passes over each batch, and RLOO at its default β.
RUNS: tuple[TRLRun, ...] = (
    TRLRun("grpo-default", "grpo", 0.04, True, "group", monitor_every=20),
    TRLRun("grpo-no-bias-correction", "grpo", 0.04, False, "group"),
    TRLRun("grpo-no-std", "grpo", 0.04, True, "none"),
    TRLRun("grpo-no-std-no-bias-correction", "grpo", 0.04, False, "none"),
    TRLRun("grpo-beta0.1", "grpo", 0.1, True, "group"),
    TRLRun("grpo-beta0.1-no-bias-correction", "grpo", 0.1, False, "group"),
    TRLRun("grpo-beta0.1-no-std", "grpo", 0.1, True, "none"),
    TRLRun("grpo-beta0.1-no-std-no-bias-correction", "grpo", 0.1, False, "none"),
    TRLRun("grpo-default-two-iterations", "grpo", 0.04, True, "group", iterations=2),
    TRLRun("rloo-default", "rloo", 0.05),
)


def distilled_model(task: ToyTask, directory: str | Path, *, steps: int = 60, lr: float = 1e-2,
                    seed: int = 0) -> float:
    """Build the toy network, distil it to ``task``'s reference and save it with its tokenizer to
    ``directory`` (TRL's trainers load the policy and the reference from there). Returns the fit's KL."""
    model, tok = kt.toy_model(task, seed=seed)
    kl = kt.distill(model, tok, task, steps=steps, lr=lr)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return kl


def make_args(spec: TRLRun, output_dir: str) -> Any:
    """The ``GRPOConfig`` or ``RLOOConfig`` of ``spec`` (CPU, float32, no logging sink, no checkpoints)."""
    import trl

    common = dict(
        output_dir=output_dir, per_device_train_batch_size=spec.batch, num_generations=spec.group,
        max_completion_length=5, max_steps=spec.steps, learning_rate=spec.lr, lr_scheduler_type="linear",
        beta=spec.beta, logging_steps=spec.monitor_every or 20, report_to="none", use_cpu=True,
        save_strategy="no", seed=0, disable_tqdm=True, gradient_checkpointing=False,
        num_iterations=spec.iterations,
        bf16=False,  # float32: TRL's default bf16 autocast (on also with use_cpu) rounds every matmul
        **spec.extra,
    )
    if spec.trainer == "grpo":
        return trl.GRPOConfig(use_bias_correction_kl=spec.bias_correction, scale_rewards=spec.scale_rewards,
                              **common)
    if spec.trainer == "rloo":
        return trl.RLOOConfig(**common)
    raise ValueError(f"trainer must be 'grpo' or 'rloo', got {spec.trainer!r}")


def _candidate_names(spec: TRLRun) -> dict[str, str]:
    """The book's names of the candidates :func:`run` measures, from the candidates' keys."""
    if spec.trainer == "rloo":
        return {"optimum": "pi*_beta", "forward/none": "forward per-token",
                "reverse/none": "reverse per-token"}
    return {"optimum": "pi*_beta", f"forward/{spec.scale_rewards}": "forward per-token",
            f"reverse/{spec.scale_rewards}": "reverse per-token",
            "forward/" + ("none" if spec.scale_rewards == "group" else "group"): "forward, other scaling",
            "reverse/" + ("none" if spec.scale_rewards == "group" else "group"): "reverse, other scaling"}


def measure_candidates(spec: TRLRun, net_task: ToyTask, table: torch.Tensor, args: Any = None) -> dict:
    """``own`` (the candidate ``spec``'s configuration predicts) and ``kl_to`` (candidate -> KL(trained ||
    candidate), nats) of a trained network's next-token ``table`` (P, V), relative to ``net_task``."""
    args = make_args(spec, tempfile.gettempdir()) if args is None else args
    logp = ex.sequence_logprobs(net_task.space, table)
    own = kt.fixed_point(net_task, args)
    cands = kt.fixed_point_candidates(net_task, args)
    names = _candidate_names(spec)
    own_key = next(k for k, v in cands.items() if k in names and torch.equal(v, own))
    return {"own": names[own_key], "kl_to": {names[k]: ex.sequence_kl(logp, cands[k]) for k in names}}


def run(
    spec: TRLRun, task: ToyTask, model_dir: str | Path, *, measure: bool = True, keep_model: bool = False
) -> dict[str, Any]:
    """Train ``spec`` from the network saved in ``model_dir`` and measure where it ended, exactly.

    Returns a dict: ``name``, the settings, ``seconds``, ``kl_ref``, ``proxy``, ``gold``, ``off_task``
    (the largest mass outside the task's tokens), ``log`` (TRL's logged ``kl``, ``reward`` and ``entropy``
    by step), with ``monitor_every`` ``monitor`` (the callback's history), with ``measure`` ``own``
    (the candidate its configuration predicts) and ``kl_to`` (candidate -> KL(trained || candidate),
    nats), ``table`` (the trained network's next-token table over the task's tokens, (P, V) float64), and
    with ``keep_model`` ``model``, the trained network.
    """
    import datasets
    import transformers
    import trl

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    model_dir = str(model_dir)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    net_task = with_reference(task, kt.model_tables(ref_model, tok, task).table)
    with tempfile.TemporaryDirectory() as out:
        args = make_args(spec, out)
        # one prompt per group of completions a step draws
        prompts = [tok.bos_token] * (spec.batch // spec.group * spec.steps)
        data = datasets.Dataset.from_dict({"prompt": prompts})
        cls = trl.GRPOTrainer if spec.trainer == "grpo" else trl.RLOOTrainer
        trainer = cls(model=model_dir, reward_funcs=kt.reward_function(task), args=args, train_dataset=data,
                      processing_class=tok)
        trainer.remove_callback(transformers.PrinterCallback)  # the log goes to the result, not stdout
        monitor = None
        if spec.monitor_every:
            monitor = kt.KLMonitorCallback(trainer, [tok.bos_token], samples_per_prompt=spec.batch,
                                           max_new_tokens=5, every=spec.monitor_every)
            trainer.add_callback(monitor)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    model = trainer.model
    tables = kt.model_tables(model, tok, net_task)
    logp = ex.sequence_logprobs(net_task.space, tables.table)
    log = [{k: rec[k] for k in ("step", "kl", "reward", "entropy") if k in rec}
           for rec in trainer.state.log_history if "kl" in rec]
    result = {**{k: v for k, v in asdict(spec).items() if k != "extra"}, "seconds": round(seconds, 1)}
    if measure:
        result |= measure_candidates(spec, net_task, tables.table, args)
    result |= {
        "kl_ref": ex.sequence_kl(logp, net_task.ref_logprobs),
        "proxy": ex.expected_reward(logp, net_task.proxy_reward),
        "gold": ex.expected_reward(logp, net_task.gold_reward),
        "off_task": tables.max_off_task,
        "log": log,
        "table": tables.table,
    }
    if monitor is not None:
        result["monitor"] = monitor.history
    if keep_model:
        result["model"] = model
    return result


def precision_effect(model: Any, tokenizer: Any, task: ToyTask) -> dict[str, float]:
    """How far a network's exact distribution over ``task`` read under bf16 autocast (as TRL's trainers
    compute it with ``bf16=True``) is from the one in its own precision: ``kl``, KL(own || bf16) in nats,
    ``max_logp``, the largest difference of a sequence's log-prob, and ``kl_ref`` (bf16 minus own: the
    change in the KL to the task's reference)."""
    own = ex.sequence_logprobs(task.space, kt.model_tables(model, tokenizer, task).table)
    half = ex.sequence_logprobs(task.space,
                                kt.model_tables(model, tokenizer, task, autocast=torch.bfloat16).table)
    return {"kl": ex.sequence_kl(own, half), "max_logp": float((own - half).abs().max()),
            "kl_ref": ex.sequence_kl(half, task.ref_logprobs) - ex.sequence_kl(own, task.ref_logprobs)}


def read_results(path: str | Path) -> dict[str, Any]:
    """The results the command line wrote with ``--json`` (None where a value was NaN)."""
    return json.loads(Path(path).read_text(encoding="utf8"))


def _short(name: str, scale: str) -> str:
    """A candidate's name in the table: pi*, or fwd/rev with the advantage scale it assumes."""
    if name == "pi*_beta":
        return "pi*"
    other = "none" if scale == "group" else "group"
    div = "fwd" if name.startswith("forward") else "rev"
    return f"{div}/{other if 'other scaling' in name else scale}"


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """One run's row of the book's table: its own candidate's KL, the nearest other candidate and its KL,
    and their ratio (how many times further the nearest other is); candidates by their short names
    (``pi*``, ``fwd/group``, ``rev/none``, ...)."""
    scale = "none" if result["trainer"] == "rloo" else result["scale_rewards"]
    to = {_short(k, scale): v for k, v in result["kl_to"].items()}
    own_name = _short(result["own"], scale)
    own = to[own_name]
    nearest = min((k for k in to if k != own_name), key=to.__getitem__)
    weighting = "-" if result["trainer"] == "rloo" else ("k3*ratio" if result["bias_correction"] else "k3")
    return {"name": result["name"], "trainer": result["trainer"], "beta": result["beta"],
            "weighting": weighting, "scale": "-" if result["trainer"] == "rloo" else scale,
            "own": own_name, "to_own": own, "nearest": nearest, "to_nearest": to[nearest],
            "ratio": to[nearest] / own, "to_optimum": to["pi*"], "kl_to": to, "kl_ref": result["kl_ref"],
            "proxy": result["proxy"], "gold": result["gold"], "iterations": result.get("iterations", 1)}


CANDIDATES: tuple[str, ...] = ("pi*", "fwd/none", "fwd/group", "rev/none", "rev/group")


def label(row: dict[str, Any]) -> str:
    """A run's short label, e.g. ``GRPO 0.04 k3*ratio group`` or ``RLOO 0.05``; ``x2`` after it for two
    passes over each batch (``num_iterations=2``)."""
    passes = f" x{row['iterations']}" if row.get("iterations", 1) > 1 else ""
    if row["trainer"] == "rloo":
        return f"RLOO {row['beta']:.2f}{passes}"
    return f"GRPO {row['beta']:.2f} {row['weighting']} {row['scale']}{passes}"


def format_table(results: dict[str, Any]) -> str:
    """The book's first table: each run's exact KL to every candidate (its own marked ``*``) and how
    many times further the nearest other candidate is than its own (at most 88 characters a line)."""
    lines = [f"{'run':27} " + " ".join(f"{c:>9}" for c in CANDIDATES) + f" {'x':>5}"]
    for r in map(summary, results["runs"]):
        cells = [(f"{r['kl_to'][c]:8.3f}" + ("*" if c == r["own"] else " ")) if c in r["kl_to"] else
                 f"{'-':>8} " for c in CANDIDATES]
        lines.append(f"{label(r):27} " + " ".join(cells) + f" {r['ratio']:5.1f}")
    return "\n".join(lines)


def format_outcomes(results: dict[str, Any]) -> str:
    """The book's second table: each run's exact KL to the reference, expected proxy and gold reward,
    and the largest mass its network puts outside the task's tokens."""
    lines = [f"{'run':27} {'KL ref':>7} {'proxy':>6} {'gold':>6} {'off-task':>9}"]
    for res, r in zip(results["runs"], map(summary, results["runs"]), strict=True):
        lines.append(f"{label(r):27} {r['kl_ref']:7.2f} {r['proxy']:6.2f} {r['gold']:6.2f}"
                     f" {res['off_task']:9.1e}")
    return "\n".join(lines)


def run_all(runs=RUNS, *, distill_steps: int = 60) -> dict[str, Any]:
    """Every run of ``runs`` from one distilled network, with the distillation's KL, the versions, the machine
    and the date (UTC)."""
    import transformers
    import trl

    torch.set_num_threads(1)
    task = book_task()
    with tempfile.TemporaryDirectory() as model_dir:
        fit = distilled_model(task, model_dir, steps=distill_steps)
        results = [run(spec, task, model_dir) for spec in runs]
        reference = _reference_table(task, model_dir)
    return {"versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__.split("+")[0]},
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, one torch thread",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "distill_kl": fit, "distill_steps": distill_steps, "runs": results, "reference": reference}


def _reference_table(task: ToyTask, model_dir: str | Path) -> torch.Tensor:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    return kt.model_tables(ref_model, tok, task).table


def write_results(results: dict[str, Any], json_path: str | Path, tables_path: str | Path | None) -> None:
    """The results as JSON, without the tables; those (each run's and the distilled reference's, (P, V)
    float64) to ``tables_path`` (``.npz``), from which :func:`remeasure` measures the runs again."""
    plain = {k: v for k, v in results.items() if k != "reference"}
    plain["runs"] = [{k: v for k, v in r.items() if k not in ("table", "model")} for r in results["runs"]]
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(_finite(plain), indent=1) + "\n", encoding="utf8")
    if tables_path is not None:
        arrays = {r["name"]: r["table"].numpy() for r in results["runs"]}
        np.savez_compressed(tables_path, reference=results["reference"].numpy(), **arrays)


def remeasure(results: dict[str, Any], tables_path: str | Path) -> dict[str, Any]:
    """``results`` (as read back) with every run's ``own`` and ``kl_to`` measured again from the stored
    tables, against the package's current fixed points: no training."""
    task = book_task()
    with np.load(tables_path) as stored:
        net_task = with_reference(task, torch.from_numpy(stored["reference"]))
        runs = []
        for r in results["runs"]:
            spec = next(s for s in RUNS if s.name == r["name"])
            table = torch.from_numpy(stored[r["name"]])
            runs.append({**r, **measure_candidates(spec, net_task, table)})
    return {**results, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kltutorial.studies.trl_runs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path,
                        help="write the results there (the book's: book/data/trl-runs.json)")
    parser.add_argument("--tables", type=Path,
                        help="write the trained networks' tables there (the book's: "
                             "book/data/trl-runs-tables.npz)")
    parser.add_argument("--remeasure", action="store_true",
                        help="no training: measure the runs of --json again from --tables, rewrite --json")
    parser.add_argument("--only", nargs="*", help="run only these names (default: every run of RUNS)")
    parser.add_argument("--steps", type=int, help="override every run's steps (a quick look)")
    ns = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if ns.remeasure:
        if not (ns.json and ns.tables):
            parser.error("--remeasure reads --json and --tables")
        results = remeasure(read_results(ns.json), ns.tables)
        ns.json.write_text(json.dumps(_finite(results), indent=1) + "\n", encoding="utf8")
        return
    runs = [r for r in RUNS if not ns.only or r.name in ns.only]
    if ns.only and len(runs) != len(ns.only):
        parser.error(f"--only: unknown names; the runs are {', '.join(r.name for r in RUNS)}")
    if ns.steps:
        from dataclasses import replace
        runs = [replace(r, steps=ns.steps) for r in runs]
    results = run_all(runs)
    for r in results["runs"]:
        dist = ", ".join(f"{k} {v:.3f}" for k, v in r["kl_to"].items())
        print(f"{r['name']:<40} own: {r['own']:<18} {dist}  ({r['seconds']:.0f} s)")
    if ns.json:
        write_results(results, ns.json, ns.tables)


def _finite(value: Any) -> Any:
    """``value`` with every NaN float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return None if value != value else value
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    main()
