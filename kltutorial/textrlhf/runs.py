r"""The real-text chapter's training runs, stored: written once by this module's command, read back by the
pages that show them (the real-text chapter, sections 1, 10 and 12), one of which trains the first steps
of a run again, live, and checks them against the stored record (so a change to the training code cannot
leave the stored runs silently stale).

The runs (:data:`BOOK_RUNS`), each :func:`~kltutorial.textrlhf.train_text` from the stored base model
with ``torch.Generator().manual_seed(0)``:

* ``gold-0``, ``gold-0.01``, ``gold-0.05``, ``gold-0.2``: the gold reward (VADER) at each β of
  :data:`~kltutorial.textrlhf.TEXT_BETAS`, :class:`~kltutorial.textrlhf.TextTrainConfig`'s defaults;
* ``proxy-0`` and ``proxy-0.05``: the learned proxy (:func:`~kltutorial.textrlhf.load_proxy_reward`)
  at β = 0 and 0.05, for :data:`PROXY_STEPS` steps: long enough for the proxy to be over-optimised.

Each run keeps its per-step records and its last batch of samples; the policies of :data:`KEPT_POLICIES`
are kept too (float16, as the base model is stored), for the per-word KL of the chapter and section 12.
Written by::

    python -m kltutorial.textrlhf.runs book/data/text-runs.npz

(about ten minutes on one thread). The file records the command, versions, machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from .._npz_store import read_npz_metadata, write_npz
from .cli import machine
from .config import TEXT_BETAS, TextTrainConfig
from .model import load_pretrained
from .trainer import FIELDS, TextTrainResult, train_text

__all__ = ["PROXY_STEPS", "BOOK_RUNS", "KEPT_POLICIES", "run_name", "book_config", "train_book_run",
           "write_runs", "read_runs", "read_metadata", "largest_difference", "main"]

#: The proxy runs' steps: the learned reward is over-optimised well within them at β = 0.
PROXY_STEPS: int = 400


def run_name(reward: str, beta: float) -> str:
    """``"gold-0.05"``: the reward, then β as the book writes it."""
    return f"{reward}-{beta:g}"


#: The stored runs: name -> (reward, β, steps).
BOOK_RUNS: dict[str, tuple[str, float, int]] = {
    **{run_name("gold", b): ("gold", b, TextTrainConfig.steps) for b in TEXT_BETAS},
    **{run_name("proxy", b): ("proxy", b, PROXY_STEPS) for b in (0.0, 0.05)},
}
#: The runs whose trained policy is stored with them.
KEPT_POLICIES: tuple[str, ...] = ("gold-0", "gold-0.05")


def book_config(name: str, *, steps: int | None = None) -> tuple[str, TextTrainConfig]:
    """The reward and :class:`~kltutorial.textrlhf.TextTrainConfig` of the book's run ``name`` (with
    ``steps`` instead of the run's own, for a live check of its first steps)."""
    if name not in BOOK_RUNS:
        raise ValueError(f"name must be one of {sorted(BOOK_RUNS)}, got {name!r}")
    reward, beta, own = BOOK_RUNS[name]
    return reward, TextTrainConfig(beta=beta, steps=own if steps is None else steps)


def train_book_run(name: str, model: PreTrainedModel, tokenizer, *, steps: int | None = None
                   ) -> TextTrainResult:
    """The book's run ``name`` (:data:`BOOK_RUNS`), from ``model`` with seed 0."""
    reward, config = book_config(name, steps=steps)
    return train_text(model, tokenizer, config, reward=reward, generator=torch.Generator().manual_seed(0))


def write_runs(runs: Mapping[str, TextTrainResult], path: str | Path, *, command: str = "",
               keep: Sequence[str] = KEPT_POLICIES) -> None:
    """Store ``runs`` (name -> :class:`~kltutorial.textrlhf.TextTrainResult`) in one ``.npz`` file: their
    records and samples, the policies of ``keep`` in float16, the command, versions, machine and date."""
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for i, (name, run) in enumerate(runs.items()):
        if not isinstance(run, TextTrainResult):
            raise TypeError(f"runs[{name!r}] must be a TextTrainResult, got {type(run).__name__}")
        for f in FIELDS:
            arrays[f"{i}/{f}"] = np.asarray(getattr(run, f))
        if name in keep:
            for key, value in run.policy.state_dict().items():
                arrays[f"{i}/policy/{key}"] = value.detach().to(torch.float16).numpy()
        entries.append({"name": name, "reward": run.reward, "config": asdict(run.config),
                        "samples": list(run.samples), "seconds": round(run.seconds, 1),
                        "policy": name in keep})
    missing = sorted(set(keep) - set(runs))
    if missing:
        raise ValueError(f"keep names runs that are not in runs: {missing}")
    from importlib import metadata

    meta = {"runs": entries, "command": command,
            "versions": {name: metadata.version(name) for name in ("torch", "transformers", "numpy",
                                                                  "vaderSentiment")},
            "machine": machine(),
            "date": datetime.date.today().isoformat()}
    write_npz(path, arrays, meta)


def read_metadata(path: str | Path) -> dict:
    """The command, versions, machine, date and runs (names, rewards, configs, samples) stored at ``path``."""
    return read_npz_metadata(path)


def read_runs(path: str | Path, model: PreTrainedModel | None = None) -> dict[str, TextTrainResult]:
    """The runs stored at ``path`` by :func:`write_runs`, as :func:`~kltutorial.textrlhf.train_text`
    returned them: records and samples exactly; ``policy`` is the stored policy (float16 weights widened
    to float32, loaded into a copy of ``model``, the base model) for the kept runs, and ``None`` for the
    others or when ``model`` is not given."""
    import copy

    with np.load(path) as data:
        meta = json.loads(str(data["metadata"]))
        runs: dict[str, TextTrainResult] = {}
        for i, entry in enumerate(meta["runs"]):
            policy = None
            if entry["policy"] and model is not None:
                prefix = f"{i}/policy/"
                state = {k[len(prefix):]: torch.from_numpy(data[k].astype(np.float32))
                         for k in data.files if k.startswith(prefix)}
                policy = copy.deepcopy(model)
                policy.load_state_dict(state)
                policy.eval()
            records = {f: data[f"{i}/{f}"].copy() for f in FIELDS}
            runs[entry["name"]] = TextTrainResult(
                policy=policy, config=TextTrainConfig(**entry["config"]), reward=entry["reward"],
                samples=tuple(entry["samples"]), seconds=entry["seconds"], **records)
    return runs


def largest_difference(live: TextTrainResult, stored: TextTrainResult, steps: int) -> float:
    """The largest difference between the exact KL (nats) that ``live`` and ``stored`` record at steps 0 to
    ``steps``. With the same seed the first ``steps`` updates of a longer run are those of a shorter one
    (a constant learning rate), so on one machine the two agree bit for bit."""
    if not (isinstance(live, TextTrainResult) and isinstance(stored, TextTrainResult)):
        raise TypeError("live and stored must be TextTrainResult, got "
                        f"{type(live).__name__} and {type(stored).__name__}")
    a, b = live.kl[: steps + 1], stored.kl[: steps + 1]
    if len(a) != steps + 1 or len(b) != steps + 1:
        raise ValueError(f"the runs do not both record steps 0 to {steps}: {len(a)} and {len(b)} records")
    return float(np.max(np.abs(a - b)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kltutorial.textrlhf.runs",
                                     description="Train and store the real-text chapter's runs.")
    parser.add_argument("path", type=Path, help="the .npz file to write, e.g. book/data/text-runs.npz")
    parser.add_argument("--runs", nargs="+", choices=sorted(BOOK_RUNS), default=list(BOOK_RUNS),
                        help="which runs (default: all)")
    parser.add_argument("--steps", type=int, help="override every run's steps (a quick look, not the book's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small tensors: one thread, and the runs repeat bit for bit
    model, tok = load_pretrained()
    runs = {}
    for name in args.runs:
        start = time.perf_counter()
        runs[name] = train_book_run(name, model, tok, steps=args.steps)
        final = runs[name].final()
        print(f"{name}: {time.perf_counter() - start:.0f} s; final gold {final.gold:.3f}, proxy "
              f"{final.proxy:.3f}, KL {final.kl:.2f}, distinct-2 {final.distinct_2:.3f}", flush=True)
    command = ["python -m kltutorial.textrlhf.runs", str(args.path)]
    if args.runs != list(BOOK_RUNS):
        command.append("--runs " + " ".join(args.runs))
    if args.steps is not None:
        command.append(f"--steps {args.steps}")
    write_runs(runs, args.path, command=" ".join(command), keep=[k for k in KEPT_POLICIES if k in runs])
    print(f"{args.path}: {len(runs)} runs")


if __name__ == "__main__":
    main(sys.argv[1:])
