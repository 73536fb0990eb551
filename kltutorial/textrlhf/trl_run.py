r"""The real-text run through TRL's ``RLOOTrainer``, watched by
:class:`~kltutorial.integrations.trl.KLMonitorCallback`.

The same base model (:func:`~kltutorial.textrlhf.load_pretrained`'s checkpoint, loaded by TRL from its
folder in float32), the same gold reward (VADER, through :func:`gold_reward_function`) and the same
algorithm as :func:`~kltutorial.textrlhf.train_text`, configured in TRL (1.16, ``rloo_trainer.py`` read):

* RLOO subtracts β times the sequence's k1 (``old_logps - ref_logps`` summed over the completion) from
  the reward, and its loss is the REINFORCE loss on the sequence's log-prob with the leave-one-out
  baseline inside each group of ``num_generations`` completions of one prompt. Here every prompt is
  ``<s>`` and the group is the whole batch (``num_generations`` = ``per_device_train_batch_size`` = 64),
  so the baseline averages the other 63 responses, as :func:`~kltutorial.textrlhf.train_text`'s does;
* one update per batch (``num_iterations`` = 1: the ratio is 1 and clips nothing), Adam without weight
  decay at a constant learning rate (``lr_scheduler_type="constant"``; TRL's default decays it
  linearly), the gradient's norm clipped to 1, ``normalize_advantages`` off (TRL's default), float32
  (``bf16=False``; TRL turns on bf16 autocast by default, also on a CPU);
* TRL samples with ``generate`` at temperature 1 with no top-k or top-p (the checkpoint's generation
  config sets none), so the callback's sampler and TRL's draw from the same distribution.

What differs is the random stream: TRL draws its samples from the global generator seeded by ``seed``, so
the two runs see different batches and agree in what they measure, not bit for bit.

The callback logs, every step, the exact per-position KL summed along 64 fresh samples
(``kltutorial/exact_kl``) beside TRL's own ``kl``: RLOO's is the **mean per-token k1** of the training
batch (the sum of the log-ratios over the batch's tokens, divided by its tokens), measured on the batch
sampled at the start of the step, that is on the policy *before* the step's update; the callback measures
after it. :class:`TRLTextResult` keeps both by the policy they measure
(:attr:`TRLTextResult.trl_policy_step`).

Written by::

    python -m kltutorial.textrlhf.trl_run book/data/text-trl-run.npz

(about three minutes on one thread); the file records the command, versions, machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .._npz_store import read_npz_metadata, write_npz
from ..toyrlhf.config import check_field
from .cli import machine
from .config import TextTrainConfig
from .model import PRETRAINED_DIR, load_pretrained
from .reward import gold_reward
from .trainer import BatchStats, evaluate_policy

__all__ = ["TRLTextConfig", "TRLTextResult", "MONITOR_KEYS", "gold_reward_function", "rloo_args",
           "train_with_trl", "write_trl_run", "read_trl_run", "main"]

#: The callback's numbers a :class:`TRLTextResult` keeps (``kltutorial/<key>`` in TRL's records).
MONITOR_KEYS: tuple[str, ...] = ("exact_kl", "exact_kl_per_token", "k1", "k3", "k3_per_token",
                                 "entropy_per_token")


@dataclass(frozen=True)
class TRLTextConfig:
    """A TRL run of the real-text experiment. The defaults are :class:`~kltutorial.textrlhf.TextTrainConfig`'s
    (the book's run at β = 0.05), with the whole batch as one RLOO group.

    Examples
    --------
    >>> TRLTextConfig().group == TRLTextConfig().batch_size
    True
    >>> TRLTextConfig(group=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: TRLTextConfig.group must divide batch_size (64), got 3
    """

    beta: float = TextTrainConfig.beta
    steps: int = TextTrainConfig.steps
    batch_size: int = TextTrainConfig.batch_size  # completions per step
    group: int = TextTrainConfig.batch_size  # num_generations: completions of one prompt, one baseline
    lr: float = TextTrainConfig.lr
    max_new_tokens: int = TextTrainConfig.max_new_tokens
    monitor_samples: int = 64  # the callback's fresh samples at each step
    seed: int = 0  # TrainingArguments.seed: TRL's sampling and the callback's generator

    def __post_init__(self) -> None:
        check_field(self, "beta", "it is RLOOConfig.beta, the KL coefficient", low=0)
        check_field(self, "steps", "the number of policy updates", low=1, integer=True)
        check_field(self, "batch_size", "per_device_train_batch_size, completions per step", low=2,
                    integer=True)
        check_field(self, "group", "num_generations, the completions of one prompt", low=2, integer=True)
        if self.batch_size % self.group:
            raise ValueError(f"TRLTextConfig.group must divide batch_size ({self.batch_size}), "
                             f"got {self.group}")
        check_field(self, "lr", "the learning rate", low=0, low_open=True)
        check_field(self, "max_new_tokens", "max_completion_length", low=1, high=64, integer=True)
        check_field(self, "monitor_samples", "the callback's samples per step", low=2, integer=True)
        check_field(self, "seed", "the training seed", low=0, integer=True)


@dataclass(frozen=True)
class TRLTextResult:
    """A TRL run's records, by step, and its final policy measured as the book's own runs are.

    Attributes
    ----------
    config : TRLTextConfig
    trl_step : ndarray, shape (steps,)
        The global step of each of TRL's records: 1, 2, ... (one record per step).
    trl_kl, trl_reward, trl_length : ndarray, shape (steps,)
        TRL's logged ``kl`` (mean per-token k1 of the step's batch), ``reward`` (the batch's mean gold
        reward, before the penalty) and ``completions/mean_length``.
    monitor_step : ndarray, shape (steps + 1,)
        The steps the callback measured: 0 (before training) to ``steps``.
    monitor : dict of str to ndarray, shape (steps + 1,)
        The callback's numbers (:data:`MONITOR_KEYS`) at each of ``monitor_step``.
    final : BatchStats
        The final policy measured by :func:`~kltutorial.textrlhf.evaluate_policy` (256 responses, seed 0),
        as the book measures its own runs' policies.
    samples : tuple of str
        The responses ``final`` measured.
    seconds : float
    policy : transformers causal LM or None
        The trained policy (``None`` when read back from a file).
    """

    config: TRLTextConfig
    trl_step: np.ndarray
    trl_kl: np.ndarray
    trl_reward: np.ndarray
    trl_length: np.ndarray
    monitor_step: np.ndarray
    monitor: dict
    final: BatchStats
    samples: tuple[str, ...]
    seconds: float
    policy: object = None

    @property
    def trl_policy_step(self) -> np.ndarray:
        """The policy each of TRL's records measured: the one before its step's update (``trl_step - 1``),
        which the callback measured at that step."""
        return self.trl_step - 1


def gold_reward_function(prompts=None, completions=None, **kwargs) -> list[float]:
    """The gold reward as TRL's ``reward_funcs`` take it: VADER's compound score of each completion's
    text (:func:`~kltutorial.textrlhf.gold_reward`). TRL logs it as ``rewards/gold_reward_function``."""
    if completions is None or isinstance(completions, str):
        raise TypeError("completions must be the list of completion texts TRL passes")
    return gold_reward(list(completions)).tolist()


def rloo_args(config: TRLTextConfig, output_dir: str | Path):
    """The ``trl.RLOOConfig`` of ``config``: CPU, float32, one record per step, no checkpoints, no sink."""
    import trl

    if not isinstance(config, TRLTextConfig):
        raise TypeError(f"config must be a TRLTextConfig, got {type(config).__name__}")
    return trl.RLOOConfig(
        output_dir=str(output_dir), per_device_train_batch_size=config.batch_size,
        num_generations=config.group, max_completion_length=config.max_new_tokens,
        max_steps=config.steps, learning_rate=config.lr, lr_scheduler_type="constant",
        beta=config.beta, temperature=1.0, max_grad_norm=1.0, num_iterations=1,
        logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=config.seed,
        disable_tqdm=True, bf16=False, activation_checkpointing=False,  # TRL turns it on by default
        model_init_kwargs={"dtype": torch.float32},
    )


def train_with_trl(config: TRLTextConfig | None = None, *, directory: str | Path | None = None,
                   evaluate: int = 256) -> TRLTextResult:
    """Train the stored base model (or the one in ``directory``) with TRL's ``RLOOTrainer`` on the gold
    reward, :class:`~kltutorial.integrations.trl.KLMonitorCallback` measuring every step, and measure the
    final policy on ``evaluate`` fresh responses.

    Examples
    --------
    >>> run = train_with_trl(TRLTextConfig(steps=2, batch_size=8, group=8, monitor_samples=4), evaluate=8)
    >>> run.trl_step.tolist(), run.monitor_step.tolist(), float(run.monitor["exact_kl"][0])
    ([1, 2], [0, 1, 2], 0.0)
    """
    import datasets
    import transformers
    import trl

    from ..integrations.trl import KLMonitorCallback

    config = TRLTextConfig() if config is None else config
    if not isinstance(config, TRLTextConfig):
        raise TypeError(f"config must be a TRLTextConfig, got {type(config).__name__}")
    if not isinstance(evaluate, int) or isinstance(evaluate, bool) or evaluate < 1:
        raise ValueError(f"evaluate must be a positive int, got {evaluate!r}")
    directory = Path(PRETRAINED_DIR if directory is None else directory)
    reference, tok = load_pretrained(directory)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    prompts = [tok.bos_token] * (config.batch_size // config.group * config.steps)
    with tempfile.TemporaryDirectory() as out:
        trainer = trl.RLOOTrainer(model=str(directory), reward_funcs=gold_reward_function,
                                  args=rloo_args(config, out), processing_class=tok,
                                  train_dataset=datasets.Dataset.from_dict({"prompt": prompts}))
        trainer.remove_callback(transformers.PrinterCallback)  # the records go to the result
        monitor = KLMonitorCallback(trainer, [tok.bos_token], samples_per_prompt=config.monitor_samples,
                                    max_new_tokens=config.max_new_tokens, every=1, seed=config.seed)
        trainer.add_callback(monitor)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    policy = trainer.accelerator.unwrap_model(trainer.model)
    policy.eval()
    records = [r for r in trainer.state.log_history if "kl" in r]
    final, samples = evaluate_policy(policy, reference, tok, n=evaluate,
                                     generator=torch.Generator().manual_seed(0))
    return TRLTextResult(
        config=config,
        trl_step=np.array([r["step"] for r in records]),
        trl_kl=np.array([r["kl"] for r in records]),
        trl_reward=np.array([r["reward"] for r in records]),
        trl_length=np.array([r["completions/mean_length"] for r in records]),
        monitor_step=np.array([h["step"] for h in monitor.history]),
        monitor={k: np.array([h[k] for h in monitor.history]) for k in MONITOR_KEYS},
        final=final, samples=tuple(samples), seconds=seconds, policy=policy,
    )


_ARRAYS = ("trl_step", "trl_kl", "trl_reward", "trl_length", "monitor_step")


def write_trl_run(run: TRLTextResult, path: str | Path, *, command: str = "") -> None:
    """Store ``run``'s records, final measures and samples (not its policy) in one ``.npz`` file, with the
    command, versions, machine and date."""
    if not isinstance(run, TRLTextResult):
        raise TypeError(f"run must be a TRLTextResult, got {type(run).__name__}")
    from importlib import metadata

    arrays = {k: getattr(run, k) for k in _ARRAYS} | {f"monitor/{k}": v for k, v in run.monitor.items()}
    meta = {"config": asdict(run.config), "final": asdict(run.final), "samples": list(run.samples),
            "seconds": round(run.seconds, 1), "command": command,
            "versions": {n: metadata.version(n) for n in ("torch", "transformers", "trl", "vaderSentiment")},
            "machine": machine(), "date": datetime.date.today().isoformat()}
    write_npz(path, arrays, meta)


def read_trl_run(path: str | Path) -> TRLTextResult:
    """The run :func:`write_trl_run` stored at ``path`` (``policy`` is ``None``); the metadata (command,
    versions, machine, date) is ``kltutorial._npz_store.read_npz_metadata(path)``'s."""
    meta = read_npz_metadata(path)
    with np.load(path) as data:
        arrays = {k: data[k].copy() for k in _ARRAYS}
        monitor = {k: data[f"monitor/{k}"].copy() for k in MONITOR_KEYS}
    return TRLTextResult(config=TRLTextConfig(**meta["config"]), monitor=monitor,
                         final=BatchStats(**meta["final"]), samples=tuple(meta["samples"]),
                         seconds=meta["seconds"], **arrays)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kltutorial.textrlhf.trl_run",
                                     description="Train the real-text run with TRL's RLOOTrainer, store it.")
    parser.add_argument("path", type=Path, help="the .npz file to write, e.g. book/data/text-trl-run.npz")
    parser.add_argument("--steps", type=int, help="override the steps (a quick look, not the book's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small tensors: one thread, and the run repeats bit for bit
    config = TRLTextConfig() if args.steps is None else TRLTextConfig(steps=args.steps)
    run = train_with_trl(config)
    command = f"python -m kltutorial.textrlhf.trl_run {args.path}" + (
        f" --steps {args.steps}" if args.steps is not None else "")
    write_trl_run(run, args.path, command=command)
    f = run.final
    print(f"{args.path}: {run.seconds:.0f} s; final gold {f.gold:.3f}, KL {f.kl:.2f}, "
          f"distinct-2 {f.distinct_2:.3f}; TRL's last kl {run.trl_kl[-1]:.3f} nats a token")


if __name__ == "__main__":
    main(sys.argv[1:])
