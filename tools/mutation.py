"""Mutation testing of the library against its own unit tests: ``python tools/mutation.py [MODULE ...]``.

``make mutation`` runs it; it is not part of ``make test``. For each module of the library a trainer
imports, mutmut (the version pinned below and in the Makefile) makes *mutants* of the module, copies
with one small change each (an operator, a constant, an argument, a string), and runs the module's own
test files on each one. A mutant that some test fails on is *killed*; one that every test passes on
*survived*: that change to the library would go unnoticed. It prints

    module           mutants  killed  survived  other   score
    estimators           393     387         6      0   98.5%

``score`` counts every mutant: the killed ones (a test failed, or the tests ran past mutmut's time
limit) over all of them, so a mutant that no test reaches (``other``: "no tests", "suspicious", a
crash) counts against it like a survivor. Then each survivor with its changed lines, and ``known
equivalent: WHY`` beside those listed in :data:`EQUIVALENT` (a change no caller can observe, such as
``sum(dim=-1)`` to ``sum(dim=+1)`` on a tensor that is always 2-D; CONTRIBUTING.md, "Mutation testing",
lists them by reason). A survivor without that mark is a gap in the tests, or a new equivalent mutant
to add to both lists with its reason.

How: mutmut 3 reads its settings from the ``[tool.mutmut]`` table of the ``pyproject.toml`` where it
runs, and writes its mutated copy of the code to ``mutants/`` there. So each module runs in a directory
of its own, ``_build/mutation/MODULE/`` (git-ignored), holding links to the package, the tests and the
tools, and a ``pyproject.toml`` that is the repository's with the module's table appended:
``only_mutate`` its source files, ``pytest_add_cli_args_test_selection`` its test files. A run starts
afresh (mutmut's cache would not notice an edited test). In that directory afterwards,
``../../../.venv/bin/mutmut show NAME`` prints one mutant's diff and ``mutmut browse`` browses them.

The default modules (:data:`DEFAULT`) take about 13 minutes on two busy cores, one mutant at a time
(``--jobs N`` runs N at once); ``logprobs.hidden``, the log-probs from the hidden states with its
vocabulary split across processes, is run only when named. ``--report`` prints the table of the last
run again without running anything.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "_build" / "mutation"
MUTMUT_VERSION = "3.8.1"  # as the Makefile's MUTMUT_VERSION


@dataclass(frozen=True)
class Target:
    """One module of the library and the test files that are its own."""

    sources: tuple[str, ...]
    tests: tuple[str, ...]


TARGETS: dict[str, Target] = {
    "monitoring": Target(("kltutorial/monitoring.py",), ("tests/test_monitoring.py",)),
    "estimators": Target(
        ("kltutorial/estimators.py",), ("tests/test_estimators.py", "tests/test_estimators_offpolicy.py")
    ),
    "controllers": Target(("kltutorial/controllers.py",), ("tests/test_controllers.py",)),
    "objective": Target(("kltutorial/objective.py",), ("tests/test_objective.py",)),
    "logprobs": Target(("kltutorial/logprobs/__init__.py",), ("tests/test_logprobs.py",)),
    "logprobs.hidden": Target(("kltutorial/logprobs/hidden.py",), ("tests/test_linear_logprobs.py",)),
}
DEFAULT = ("monitoring", "estimators", "controllers", "objective", "logprobs")

# What each run's directory links to: the package, the tests, the pytest plugins conftest.py loads.
LINKED = ("kltutorial", "tests", "tools", "conftest.py")

# mutmut's statuses (mutmut.stats.status_by_exit_code) that count as killed.
KILLED = {"killed", "timeout", "caught by type check"}


@dataclass(frozen=True)
class Equivalent:
    """Survivors known to change nothing observable: mutants of ``module`` in a function matching the
    glob ``functions`` whose removed lines contain ``old`` and added lines ``new``."""

    module: str
    functions: str
    old: str
    new: str
    why: str


_2D = "the tensor is always 2-D, (B, T) or (rows, V): dim +1 is dim -1"
_CPU = "every tensor of the tests is on the CPU, the only device the default gives"
_CAST = "type promotion (or the in-place operation) casts to the same dtype anyway"
EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent("monitoring", "sequence_k1_k3", "sum(-1)", "sum(+1)", _2D),
    Equivalent("monitoring", "exact_kl_check", "sum(-1)", "sum(+1)", _2D),
    Equivalent("monitoring", "kl_log_stats", ".to(torch.float64)", ".to(None)",
               "the other operand is float64, so the difference is float64 anyway"),
    Equivalent("monitoring", "exact_kl_check", ".to(torch.float64)", ".to(None)",
               "the other operand is float64, so the difference is float64 anyway"),
    Equivalent("monitoring", "detect_spikes", "n > window", "n >= window",
               "with n == window there is no step to score: both give empty statistics"),
    Equivalent("monitoring", "detect_spikes", 'errstate(invalid="ignore")', "errstate(invalid=None)",
               "NumPy >= 1.26 compares NaN scores without an invalid-value warning"),
    Equivalent("estimators", "_log_ratio", ".to(dtype)", ".to(None)", _CAST),
    Equivalent("estimators", "compute_token_kl", ".to(per_sequence.dtype)", ".to(None)", _CAST),
    Equivalent("estimators", "compute_token_kl", "dim=-1", "dim=+1", _2D),
    Equivalent("estimators", "_estimate", "clamp(-clamp, clamp)", "clamp(None, clamp)",
               "the exact KL is >= 0, so the lower bound -clamp never clips"),
    Equivalent("controllers", "[KFDE]*.next_beta", "n_steps: int = 1", "n_steps: int = 2",
               "this rule ignores n_steps (only the proportional rule uses it, and its default is tested)"),
    Equivalent("controllers", "AdaptiveKLController.next_beta", 'under="ignore"', "under=None",
               "NumPy ignores underflow by default; the clip keeps beta >= the smallest normal float"),
    Equivalent("controllers", "AdaptiveKLController.next_beta", 'under="ignore"', 'over="ignore", )',
               "NumPy ignores underflow by default; the clip keeps beta >= the smallest normal float"),
    Equivalent("objective", "compute_rlhf_objective", "dim=-1", "dim=+1", _2D),
    Equivalent("objective", "last_valid_positions", "-1", "+1", _2D),
    Equivalent("objective", "last_valid_positions", "device=mask.device", "device=None", _CPU),
    Equivalent("objective", "last_valid_positions", "device=mask.device", "[-1], )", _CPU),
    Equivalent("objective", "last_valid_positions", "positions, -1)", "positions, -2)",
               "a row without a valid position has raised before: the fill value never wins the max"),
    Equivalent("objective", "shape_rewards", "scores.to(rewards.dtype)", "scores.to(None)", _CAST),
    Equivalent("logprobs", "_fix_nan_rows", "(-1)", "(+1)", _2D),
    Equivalent("logprobs", "_[TE]*.forward", "dim=-1", "dim=+1", _2D),
    Equivalent("logprobs", "*", "device=", "device=None", _CPU),
    Equivalent("logprobs", "*", "device=", ", )", _CPU),
    Equivalent("logprobs", "_ExactKL.forward", "device = policy_logits.device", "device = None", _CPU),
    Equivalent("logprobs", "_ExactKL.forward", "dtype, device)", "dtype, None)", _CPU),
    Equivalent("logprobs", "_TokenLogprobs.forward", "logits.device)", "None)", _CPU),
    Equivalent("logprobs", "_ExactKL.forward", "probe = torch.empty(2, N, dtype=dtype",
               "probe = torch.empty(", "the probes only look for NaN, which float32 keeps (3 rows hold 2)"),
    Equivalent("logprobs", "_ExactKL.forward", "_Buffers(4,", "_Buffers(5,", "one more buffer, never used"),
    Equivalent("logprobs", "_raise_if_bad_rows", "temperature: float = 1.0", "temperature: float = 2.0",
               "every caller passes the temperature"),
)


def mutmut_table(target: Target) -> str:
    """The ``[tool.mutmut]`` table of one module's run."""
    def toml_list(items: tuple[str, ...]) -> str:
        return "[" + ", ".join(json.dumps(x) for x in items) + "]"

    return "\n".join([
        "",
        "[tool.mutmut]",
        'source_paths = ["kltutorial"]',
        f"only_mutate = {toml_list(target.sources)}",
        f"pytest_add_cli_args_test_selection = {toml_list(target.tests)}",
        # conftest.py at the root loads the plugins in tools/; mutmut copies tests/ by itself
        'also_copy = ["conftest.py", "tools"]',
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        # every run starts afresh, so there is nothing for git to tell mutmut
        "use_git_change_detection = false",
        "",
    ])


def prepare(name: str, target: Target) -> Path:
    """A fresh ``_build/mutation/NAME/`` linking to the repository, with its ``pyproject.toml``."""
    work = WORK / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for path in LINKED:
        (work / path).symlink_to(ROOT / path)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf8")
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("error: pyproject.toml has a [tool.mutmut] table; tools/mutation.py writes its own")
    (work / "pyproject.toml").write_text(pyproject + mutmut_table(target), encoding="utf8")
    return work


def mutmut() -> Path:
    """The venv's mutmut, at the pinned version."""
    exe = Path(sys.executable).with_name("mutmut")
    try:
        version = metadata.version("mutmut")
    except metadata.PackageNotFoundError:
        version = None
    if version != MUTMUT_VERSION or not exe.exists():
        raise SystemExit(f"error: this needs mutmut {MUTMUT_VERSION} (found {version}): "
                         f"{sys.executable} -m pip install mutmut=={MUTMUT_VERSION}, or make mutation")
    return exe


def run(name: str, target: Target, jobs: int) -> None:
    """Run mutmut on one module in its own fresh directory."""
    work = prepare(name, target)
    log = work / "mutmut.log"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.monotonic()
    print(f"{name}: mutmut on {', '.join(target.sources)} against {', '.join(target.tests)} ...", flush=True)
    with log.open("w", encoding="utf8") as out:
        proc = subprocess.run(
            [str(mutmut()), "run", "--max-children", str(jobs)], cwd=work, env=env, stdout=out, stderr=out
        )
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf8", errors="replace")[-3000:]
        raise SystemExit(f"error: mutmut failed on {name} (exit {proc.returncode}); end of {log}:\n{tail}")
    print(f"{name}: done in {time.monotonic() - start:.0f} s", flush=True)


def statuses(name: str, target: Target) -> dict[str, str]:
    """Each mutant of the last run on ``name`` and its status, in mutmut's words."""
    from mutmut.stats import status_by_exit_code

    out: dict[str, str] = {}
    for source in target.sources:
        meta = WORK / name / "mutants" / (source + ".meta")
        if not meta.exists():
            raise SystemExit(f"error: no results for {name} in {meta.parent}; run it first")
        for key, code in json.loads(meta.read_text(encoding="utf8"))["exit_code_by_key"].items():
            out[key] = status_by_exit_code[code]
    return out


def changed_lines(name: str, mutant: str) -> tuple[list[str], list[str]]:
    """The lines a mutant removes and adds, from ``mutmut show``."""
    shown = subprocess.run(
        [str(mutmut()), "show", mutant], cwd=WORK / name, capture_output=True, text=True
    ).stdout.splitlines()
    removed = [ln[1:] for ln in shown if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in shown if ln.startswith("+") and not ln.startswith("+++")]
    return removed, added


def function_of(mutant: str) -> str:
    """``kltutorial.controllers.xǁAdaptiveKLControllerǁnext_beta__mutmut_26`` ->
    ``AdaptiveKLController.next_beta``."""
    name = mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    return name.removeprefix("x_").removeprefix("xǁ").replace("ǁ", ".")


def known_equivalent(name: str, mutant: str, removed: list[str], added: list[str]) -> str | None:
    """Why the survivor ``mutant`` of module ``name`` is equivalent, if :data:`EQUIVALENT` says so."""
    old, new, function = "\n".join(removed), "\n".join(added), function_of(mutant)
    for e in EQUIVALENT:
        if e.module == name and fnmatch.fnmatchcase(function, e.functions) and e.old in old and e.new in new:
            return e.why
    return None


def _group(status: str) -> str:
    return "killed" if status in KILLED else "survived" if status == "survived" else "other"


def _row(name: str, counts: Counter[str]) -> str:
    score = 100.0 * counts["killed"] / counts["mutants"] if counts["mutants"] else float("nan")
    return (f"{name:<16} {counts['mutants']:>7} {counts['killed']:>7} {counts['survived']:>9} "
            f"{counts['other']:>6} {score:>6.1f}%")


def report(names: list[str], show_diff: bool = True) -> int:
    """Print the table and the survivors of the last run on ``names``; the number of unexplained ones."""
    results = {name: statuses(name, TARGETS[name]) for name in names}
    header = f"{'module':<16} {'mutants':>7} {'killed':>7} {'survived':>9} {'other':>6} {'score':>7}"
    print(f"\nmutmut {metadata.version('mutmut')}, each module against its own test files\n")
    print(header + "\n" + "-" * len(header))
    totals: Counter[str] = Counter()
    for name, found in results.items():
        counts = Counter(_group(s) for s in found.values())
        counts["mutants"] = len(found)
        totals.update(counts)
        print(_row(name, counts))
    if len(results) > 1:
        print("-" * len(header) + "\n" + _row("all", totals))

    unexplained = 0
    for name, found in results.items():
        left = sorted((k, s) for k, s in found.items() if _group(s) != "killed")
        if not left:
            continue
        print(f"\n{name}: {len(left)} not killed")
        for key, status in left:
            if not show_diff:
                print(f"  {key} ({status})")
                continue
            removed, added = changed_lines(name, key)
            why = known_equivalent(name, key, removed, added) if status == "survived" else None
            unexplained += why is None
            print(f"  {key} ({status}{'; known equivalent: ' + why if why else ''})")
            for sign, lines in (("-", removed), ("+", added)):
                print("\n".join(f"      {sign} {ln.strip()}" for ln in lines))
    if show_diff:
        print(f"\n{unexplained} not killed and not known to be equivalent")
    return unexplained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE",
                        help=f"modules to test, of {', '.join(TARGETS)} (default: {' '.join(DEFAULT)})")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--report", action="store_true", help="print the last run's results; run nothing")
    parser.add_argument("--no-diff", action="store_true", help="list what was not killed without its change")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.modules) - set(TARGETS))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    names = args.modules or list(DEFAULT)
    mutmut()
    if not args.report:
        for name in names:
            run(name, TARGETS[name], args.jobs)
    report(names, show_diff=not args.no_diff)
    return 0


if __name__ == "__main__":
    sys.exit(main())
