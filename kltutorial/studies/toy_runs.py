r"""The book's longest toy training runs, stored: written once by this module's command, read back by the
page that shows them, which trains the first steps of one of them again, live, and checks them against
the stored run (so a change to the training code cannot leave the stored runs silently stale).

Two sets, each in one ``.npz`` file under ``book/data/``:

* ``control``: section 11's six runs of :data:`CONTROL_STEPS` steps, two fixed :math:`\beta` and four
  controllers (:func:`control_controllers`), on :func:`book_task`;
* ``betas``: section 11's sweep of fixed coefficients, one run at each of
  :data:`~kltutorial.toyrlhf.FIXED_BETAS` (:func:`beta_runs`);
* ``transformer``: section 11a's PPO and Dr. GRPO runs of a small transformer (:func:`transformer_runs`,
  the network fitted by :func:`fitted_transformer`);
* ``recipes-0.3`` and ``recipes-0.1``: sections 9 and 9a's runs at :math:`\beta` = 0.3 and 0.1, every
  recipe of :data:`~kltutorial.toyrlhf.recipes.RECIPES` but TRL's ratio-weighted k3 (the page on TRL
  trains that one in TRL), and at 0.1 PPO with four and with one epoch for seeds 0, 1 and 2 too
  (:func:`recipe_runs`, :data:`RECIPE_SETS`).

Written by::

    python -m kltutorial.studies.toy_runs control book/data/toy-control-runs.npz
    python -m kltutorial.studies.toy_runs betas book/data/toy-beta-runs.npz
    python -m kltutorial.studies.toy_runs transformer book/data/toy-transformer-runs.npz
    python -m kltutorial.studies.toy_runs recipes-0.3 book/data/toy-recipe-runs-0.3.npz
    python -m kltutorial.studies.toy_runs recipes-0.1 book/data/toy-recipe-runs-0.1.npz

(about 30, 15, 30, 30 and 45 seconds on one core). The file records the command, the package
versions, the machine and the date beside the runs; :func:`read_runs` gives back the same
:class:`~kltutorial.toyrlhf.TrainResult` and :class:`~kltutorial.toyrlhf.recipes.RecipeResult` objects
the training returned, float64 throughout, bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from .. import exact as ex
from .._npz_store import read_npz_metadata, write_npz
from ..controllers import (
    AdaptiveKLController,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
    KLController,
)
from ..toyrlhf import FIXED_BETAS, TaskConfig, TrainConfig, TrainResult, make_task, train_policy
from ..toyrlhf import recipes as rc
from ..toyrlhf.task import ToyTask
from ..toyrlhf.transformer import TransformerPolicy, fit_reference

__all__ = ["book_task", "CONTROL_BETA0", "CONTROL_TARGET", "CONTROL_STEPS", "CONTROL_SEED",
           "control_controllers", "control_runs", "beta_run_name", "beta_runs", "RECIPE_SETS",
           "RECIPE_SEEDS", "recipe_runs", "seed_run_name", "write_runs", "read_runs", "read_metadata",
           "largest_difference", "TRANSFORMER_SETTINGS", "TRANSFORMER_BUDGET", "fitted_transformer",
           "transformer_runs", "main"]

#: Section 11's controller runs: initial (or fixed) beta, KL target in nats, steps, training seed.
CONTROL_BETA0, CONTROL_TARGET, CONTROL_STEPS, CONTROL_SEED = 0.05, 2.0, 600, 0
#: The stored sets of recipe runs: name -> (beta, with the seed study or not); section 9's and 9a's.
RECIPE_SETS = {"recipes-0.3": (0.3, False), "recipes-0.1": (0.1, True)}
#: The seeds of section 9a's PPO runs with four and with one epoch.
RECIPE_SEEDS = (0, 1, 2)

_SETTINGS = {cls.__name__: cls for cls in (rc.PPOSettings, rc.RLOOSettings, rc.GRPOSettings)}
_TRAIN_FIELDS = ("kl", "kl_sampled", "beta", "proxy", "gold")
_RECIPE_FIELDS = ("steps", "kl", "proxy", "gold")


def book_task() -> ToyTask:
    """The toy task of book section 11 (its default configuration and seeds), which 9a, 9b and 11 train on."""
    config = TaskConfig()
    return make_task(config, rng=np.random.default_rng(0),
                     data_rng=np.random.default_rng([0, config.n_pairs, 0]))


def control_controllers(task: ToyTask) -> dict[str, KLController]:
    """Section 11's six ways of setting beta, fresh (each run changes its controller's state), by name.

    Two fixed coefficients, :data:`CONTROL_BETA0` and the beta whose exact optimum sits at the target KL
    (:func:`~kltutorial.exact.beta_for_budget`), then the proportional rule at two horizons, the doubling
    rule and the exponential rule, each starting at :data:`CONTROL_BETA0` with target
    :data:`CONTROL_TARGET`.
    """
    beta_t = ex.beta_for_budget(task.ref_logprobs, task.proxy_reward, CONTROL_TARGET)
    beta0, target = CONTROL_BETA0, CONTROL_TARGET
    return {
        f"fixed β = {beta0:g}": FixedKLController(beta0),
        f"fixed β = {beta_t:.2f}": FixedKLController(beta_t),
        "proportional, H = 30,000": AdaptiveKLController(beta=beta0, target_kl=target, horizon=30_000),
        "proportional, H = 10,000": AdaptiveKLController(beta=beta0, target_kl=target, horizon=10_000),
        "doubling rule": DoublingKLController(beta=beta0, target_kl=target),
        "exponential rule": ExponentialKLController(beta=beta0, target_kl=target),
    }


def control_runs(task: ToyTask, *, steps: int = CONTROL_STEPS,
                 names: list[str] | None = None) -> dict[str, TrainResult]:
    """Train section 11's controller runs (or the ``names`` among them) for ``steps`` steps, seed
    :data:`CONTROL_SEED`, each with a fresh controller from :func:`control_controllers`."""
    controllers = control_controllers(task)
    unknown = sorted(set(names or ()) - set(controllers))
    if unknown:
        raise ValueError(f"names must be among {sorted(controllers)}, got {unknown}")
    return {name: train_policy(task, TrainConfig(steps=steps), controller=c,
                               generator=torch.Generator().manual_seed(CONTROL_SEED))
            for name, c in controllers.items() if names is None or name in names}


def beta_run_name(beta: float) -> str:
    """The stored name of the run of section 11's sweep at ``beta``."""
    return f"beta = {beta!r}"


def beta_runs(task: ToyTask, *, steps: int | None = None,
              betas: list[float] | None = None) -> dict[str, TrainResult]:
    """Train section 11's sweep (or the ``betas`` among it): one run at each fixed beta of
    :data:`~kltutorial.toyrlhf.FIXED_BETAS`, seed :data:`CONTROL_SEED`, ``steps`` steps each (default:
    :class:`~kltutorial.toyrlhf.TrainConfig`'s), named by :func:`beta_run_name`."""
    unknown = sorted(set(betas or ()) - set(FIXED_BETAS))
    if unknown:
        raise ValueError(f"betas must be among {list(FIXED_BETAS)}, got {unknown}")
    return {beta_run_name(beta): train_policy(
                task, TrainConfig(beta=beta) if steps is None else TrainConfig(beta=beta, steps=steps),
                generator=torch.Generator().manual_seed(CONTROL_SEED))
            for beta in FIXED_BETAS if betas is None or beta in betas}


#: Section 11a's transformer runs: beta, batch size, learning rate (a network needs a far smaller step
#: than the table's).
TRANSFORMER_SETTINGS = {"beta": 0.3, "batch_size": 512, "lr": 3e-3}
#: Section 11a's transformer runs: each recipe's steps.
TRANSFORMER_BUDGET = {"ppo-k1-reward": 40, "dr-grpo-k3-loss": 150}


def fitted_transformer(task: ToyTask) -> TransformerPolicy:
    """Section 11a's network: a :class:`~kltutorial.toyrlhf.transformer.TransformerPolicy` drawn with seed
    0 and fitted to ``task``'s reference by enumeration
    (:func:`~kltutorial.toyrlhf.transformer.fit_reference`); its next-token table is the reference of its
    runs."""
    net = TransformerPolicy(task.space, generator=torch.Generator().manual_seed(0))
    fit_reference(net, task.ref_table)
    return net


def transformer_runs(task: ToyTask, net: TransformerPolicy, *, names: list[str] | None = None,
                     steps: int | None = None) -> dict[str, rc.RecipeResult]:
    """Train section 11a's recipes (or the ``names`` among
    :data:`~kltutorial.studies.toy_runs.TRANSFORMER_BUDGET`), each from its own copy of ``net``, for its
    budget's steps (or ``steps``), with :data:`~kltutorial.studies.toy_runs.TRANSFORMER_SETTINGS` and
    seed 0.
    Each result's ``task`` is ``task`` with the network as its reference
    (:func:`~kltutorial.toyrlhf.recipes.with_reference`)."""
    unknown = sorted(set(names or ()) - set(TRANSFORMER_BUDGET))
    if unknown:
        raise ValueError(f"names must be among {sorted(TRANSFORMER_BUDGET)}, got {unknown}")
    runs = {}
    for name, budget in TRANSFORMER_BUDGET.items():
        if names is None or name in names:
            config = TrainConfig(steps=steps or budget, **TRANSFORMER_SETTINGS)
            runs[name] = rc.train_recipe(task, name, config, policy=copy.deepcopy(net),
                                         generator=torch.Generator().manual_seed(0))
    return runs


def seed_run_name(epochs: int, seed: int) -> str:
    """The stored name of a PPO run of section 9a's seed study."""
    return f"ppo-k1-reward, {epochs} epochs, seed {seed}"


def recipe_runs(task: ToyTask, beta: float, *, seeds: bool = False, steps: int | None = None,
                names: list[str] | None = None) -> dict[str, rc.RecipeResult]:
    """Train section 9's or 9a's runs at ``beta`` (or the ``names`` among them), ``steps`` steps each
    (default: :class:`~kltutorial.toyrlhf.TrainConfig`'s).

    One run per recipe, seed 0, named by the recipe; with ``seeds``, then ``ppo-k1-reward`` with PPO's
    default epochs and with one epoch for each seed of :data:`RECIPE_SEEDS` (:func:`seed_run_name`), but
    the default epochs' seed 0, which is the recipe's own run.
    """
    config = TrainConfig(beta=beta) if steps is None else TrainConfig(beta=beta, steps=steps)
    specs: dict[str, tuple[str, object, int]] = {
        name: (name, None, 0) for name in rc.RECIPES if name != "grpo-k3ratio-loss"}
    default_epochs = rc.PPOSettings().epochs
    for epochs in (default_epochs, 1) if seeds else ():
        for seed in RECIPE_SEEDS:
            if (epochs, seed) != (default_epochs, 0):
                specs[seed_run_name(epochs, seed)] = ("ppo-k1-reward", rc.PPOSettings(epochs=epochs), seed)
    unknown = sorted(set(names or ()) - set(specs))
    if unknown:
        raise ValueError(f"names must be among {sorted(specs)}, got {unknown}")
    return {name: rc.train_recipe(task, recipe, config, settings=settings,
                                  generator=torch.Generator().manual_seed(seed))
            for name, (recipe, settings, seed) in specs.items() if names is None or name in names}


def write_runs(runs: Mapping[str, TrainResult | rc.RecipeResult], path: str | Path, *,
               command: str = "") -> None:
    """Store ``runs`` (name -> result of :func:`~kltutorial.toyrlhf.train_policy` or of
    :func:`~kltutorial.toyrlhf.recipes.train_recipe` with the table policy) in one ``.npz`` file, with
    the command, the versions, the machine and the date."""
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for i, (name, run) in enumerate(runs.items()):
        if isinstance(run, TrainResult):
            entry = {"name": name, "kind": "train"}
            fields = _TRAIN_FIELDS
        elif isinstance(run, rc.RecipeResult):
            table_run = isinstance(run.logprobs, torch.Tensor) and (
                run.logprobs.shape == run.task.ref_logprobs.shape)
            if not table_run:
                raise ValueError(f"runs[{name!r}] is not a run of the table policy")
            settings = None if run.settings is None else {
                "class": type(run.settings).__name__, "fields": dataclasses.asdict(run.settings)}
            entry = {"name": name, "kind": "recipe", "recipe": run.recipe, "beta": run.beta,
                     "group_size": run.group_size, "settings": settings}
            fields = _RECIPE_FIELDS
        else:
            raise TypeError(f"runs[{name!r}] must be a TrainResult or a RecipeResult, "
                            f"got {type(run).__name__}")
        arrays[f"{i}/logprobs"] = run.logprobs.detach().to(torch.float64).numpy()
        for f in fields:
            arrays[f"{i}/{f}"] = np.asarray(getattr(run, f))
        entries.append(entry)
    meta = {"runs": entries, "command": command,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "numpy": np.__version__},
            "machine": f"{platform.machine()}, {platform.processor() or 'unknown CPU'}, "
                       f"{torch.get_num_threads()} torch thread(s)",
            "date": datetime.date.today().isoformat()}
    write_npz(path, arrays, meta)


def read_metadata(path: str | Path) -> dict:
    """The command, versions, machine, date and run names stored with the runs at ``path``."""
    return read_npz_metadata(path)


def read_runs(path: str | Path, task: ToyTask) -> dict[str, TrainResult | rc.RecipeResult]:
    """The runs stored at ``path`` by :func:`write_runs`, as the training returned them; ``task`` is the
    task they trained on (a recipe run's ``task``)."""
    if not isinstance(task, ToyTask):
        raise TypeError(f"task must be a ToyTask (e.g. book_task()), got {type(task).__name__}")
    with np.load(path) as data:
        meta = json.loads(str(data["metadata"]))
        runs: dict[str, TrainResult | rc.RecipeResult] = {}
        for i, entry in enumerate(meta["runs"]):
            logprobs = torch.from_numpy(data[f"{i}/logprobs"].copy())
            if logprobs.shape != task.ref_logprobs.shape:
                raise ValueError(f"{path}: run {entry['name']!r} has {logprobs.numel()} log-probs, "
                                 f"task has {task.ref_logprobs.numel()} sequences: not the runs' task")
            if entry["kind"] == "train":
                runs[entry["name"]] = TrainResult(logprobs, *(data[f"{i}/{f}"].copy() for f in _TRAIN_FIELDS))
            else:
                stored = entry["settings"]
                settings = None if stored is None else _SETTINGS[stored["class"]](**stored["fields"])
                steps, kl, proxy, gold = (data[f"{i}/{f}"].copy() for f in _RECIPE_FIELDS)
                runs[entry["name"]] = rc.RecipeResult(
                    recipe=entry["recipe"], beta=entry["beta"], logprobs=logprobs, task=task,
                    group_size=entry["group_size"], steps=steps, kl=kl, proxy=proxy, gold=gold,
                    settings=settings)
    return runs


def largest_difference(live: TrainResult | rc.RecipeResult, stored: TrainResult | rc.RecipeResult,
                       steps: int) -> float:
    """The largest difference, in nats, between the exact KL of ``live`` and of ``stored`` at steps 0 to
    ``steps`` (the policies after 0 to ``steps`` updates). A run of ``2 * steps`` steps makes its first
    ``steps`` updates at the full learning rate, as a longer run does, so with the same seed the two
    agree there bit for bit on one machine."""
    if isinstance(live, TrainResult) and isinstance(stored, TrainResult):
        a, b = live.kl[:steps + 1], stored.kl[:steps + 1]
    elif isinstance(live, rc.RecipeResult) and isinstance(stored, rc.RecipeResult):
        a, b = live.kl[live.steps <= steps], stored.kl[stored.steps <= steps]
    else:
        raise TypeError("live and stored must both be TrainResult or both RecipeResult, got "
                        f"{type(live).__name__} and {type(stored).__name__}")
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"the runs do not both record steps 0 to {steps}: {len(a)} and {len(b)} records")
    return float(np.max(np.abs(a - b)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kltutorial.studies.toy_runs",
                                     description="Train and store the book's longest toy runs.")
    parser.add_argument("set", choices=("control", "betas", "transformer", *RECIPE_SETS),
                        help="section 11's runs (control, betas), 11a's (transformer: PPO's and "
                        "Dr. GRPO's), or section 9's (recipes-0.3) or 9a's (recipes-0.1)")
    parser.add_argument("path", type=Path, help="the .npz file to write, e.g. book/data/toy-control-runs.npz")
    parser.add_argument("--steps", type=int, help="override every run's steps (a quick look, not the book's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny tensors: one thread is faster, and the runs repeat bit for bit
    task = book_task()
    if args.set == "control":
        runs = control_runs(task, steps=args.steps or CONTROL_STEPS)
    elif args.set == "betas":
        runs = beta_runs(task, steps=args.steps)
    elif args.set == "transformer":
        runs = transformer_runs(task, fitted_transformer(task), steps=args.steps)
    else:
        beta, seeds = RECIPE_SETS[args.set]
        runs = recipe_runs(task, beta, seeds=seeds, steps=args.steps)
    command = ["python -m kltutorial.studies.toy_runs", args.set, str(args.path)]
    if args.steps is not None:
        command.append(f"--steps {args.steps}")
    write_runs(runs, args.path, command=" ".join(command))
    print(f"{args.path}: {len(runs)} runs")


if __name__ == "__main__":
    main(sys.argv[1:])
