"""The command line of the real-text experiment: ``python -m kltutorial.textrlhf pretrain | proxy | sweep``.

* ``pretrain`` trains the base model (:func:`~kltutorial.textrlhf.pretrain.pretrain`) and writes it, with
  ``pretrain.json`` (the command, machine, date, corpus sizes, validation perplexity, and what 512 of
  its samples measure), to ``--out`` (default: the directory the package ships,
  :data:`~kltutorial.textrlhf.PRETRAINED_DIR`).
* ``proxy`` learns the proxy reward from the stored base model (:func:`~kltutorial.textrlhf.train_proxy`)
  and writes it, with ``proxy.json`` (the command, machine, date, data and validation accuracies), to
  ``--out`` (default: :data:`~kltutorial.textrlhf.PROXY_DIR`).
* ``sweep`` trains one policy per β from the stored model (:func:`~kltutorial.textrlhf.train_text`)
  and prints, for the reference and each β, what ``--eval`` fresh samples of the final policy measure;
  ``--json`` writes it with the settings, machine and date.

The only place where seeds become generators: ``--seed`` seeds one ``torch.Generator`` per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from .config import TEXT_BETAS, TextTrainConfig
from .corpus import PACKAGES, load_corpus
from .metrics import corpus_ngrams, corpus_share, distinct_n
from .model import PRETRAINED_DIR, load_pretrained, save_pretrained
from .pretrain import PretrainConfig, encode_quotes, perplexity, pretrain
from .proxy import (
    PROXY_DIR,
    ProxyConfig,
    comparisons,
    load_proxy_reward,
    pair_accuracies,
    save_proxy,
    train_proxy,
)
from .trainer import evaluate_policy, train_text

__all__ = ["main", "machine", "reference_measures"]

#: Responses sampled to measure the reference and each trained policy.
EVAL_SAMPLES = 512


def machine() -> str:
    """The CPU, its cores and the torch threads: what a stored number was measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu} ({platform.machine()}), {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)"


def _versions() -> dict[str, str]:
    from importlib import metadata

    names = ("torch", "transformers", "tokenizers", "vaderSentiment", *PACKAGES)
    return {name: metadata.version(name) for name in names}


def reference_measures(model, tokenizer, corpus, *, n: int = EVAL_SAMPLES, seed: int = 0,
                       max_new_tokens: int = TextTrainConfig.max_new_tokens) -> dict[str, float]:
    """What ``n`` samples of the base model measure: the share of their words and word pairs found in
    the corpus, distinct-1/2 (in batches of 64), length, the gold reward; sampled with
    ``torch.Generator().manual_seed(seed)``."""
    stats, texts = evaluate_policy(model, model, tokenizer, n=n, max_new_tokens=max_new_tokens,
                                   generator=torch.Generator().manual_seed(seed))
    texts_all = corpus.train + corpus.validation
    return {
        "samples": n,
        "corpus_word_share": corpus_share(texts, corpus_ngrams(texts_all, 1), 1),
        "corpus_bigram_share": corpus_share(texts, corpus_ngrams(texts_all, 2), 2),
        "distinct_1": stats.distinct_1,
        "distinct_2": stats.distinct_2,
        "length": stats.length,
        "gold": stats.gold,
        # the same measure of real quotes: distinct-2 in batches of 64 validation quotes, averaged
        "validation_quotes_distinct_2": float(np.mean([distinct_n(corpus.validation[i : i + 64], 2)
                                                       for i in range(0, n - 63, 64)])),
    }


def _pretrain(args: argparse.Namespace, argv: Sequence[str]) -> dict:
    config = PretrainConfig(**{f.name: getattr(args, f.name) for f in fields(PretrainConfig)
                               if getattr(args, f.name, None) is not None})
    corpus = load_corpus()
    result = pretrain(corpus, config, generator=torch.Generator().manual_seed(args.seed), progress=True)
    out = Path(args.out)
    tok = result.tokenizer
    metadata = {
        **_provenance(argv, args.seed, config),
        "parameters": sum(p.numel() for p in result.model.parameters()),
        "vocabulary": len(tok),
        "corpus": {
            "files": list(corpus.files),
            "train_quotes": len(corpus.train),
            "validation_quotes": len(corpus.validation),
            "characters": corpus.characters,
            "train_tokens": sum(len(s) - 1 for s in encode_quotes(tok, corpus.train)),
            "unknown_share_validation": _unknown_share(tok, corpus.validation),
            "dropped": dict(corpus.dropped),
        },
        "epoch_validation_perplexity": [round(p, 3) for p in result.validation_perplexity],
        "best_epoch": result.best_epoch,
        "train_seconds": round(result.seconds, 1),
        "train_cpu_seconds": round(result.cpu_seconds, 1),
    }
    save_pretrained(result.model, tok, out, metadata)
    model, tok = load_pretrained(out)  # the stored float16 weights, measured as a reader will load them
    metadata["validation_perplexity"] = round(perplexity(model, tok, corpus.validation), 3)
    metadata["reference_samples"] = reference_measures(model, tok, corpus)
    save_pretrained(model, tok, out, metadata)
    print(json.dumps({k: metadata[k] for k in ("validation_perplexity", "reference_samples", "parameters")},
                     indent=1))
    return metadata


def _proxy(args: argparse.Namespace, argv: Sequence[str]) -> dict:
    config = ProxyConfig(**{f.name: getattr(args, f.name) for f in fields(ProxyConfig)
                            if getattr(args, f.name, None) is not None})
    base, tok = load_pretrained(args.model)
    result = train_proxy(base, tok, config, generator=torch.Generator().manual_seed(args.seed), progress=True)
    metadata = {
        **_provenance(argv, args.seed, config),
        "parameters": sum(p.numel() for p in result.proxy.model.parameters()),
        "epoch_validation_loss": [round(x, 4) for x in result.validation_loss],
        "best_epoch": result.best_epoch,
        "train_seconds": round(result.seconds, 1),
    }
    out = Path(args.out)
    save_proxy(result.proxy, out, metadata)
    # the stored float16 weights, measured on fresh held-out pairs (seed + 1) as a reader will load them
    proxy = load_proxy_reward(out)
    held = comparisons(base, tok, config.validation_pairs, config,
                       torch.Generator().manual_seed(args.seed + 1))
    metadata["validation"] = {k: round(v, 4) for k, v in pair_accuracies(proxy, held).items()}
    save_proxy(proxy, out, metadata)
    print(json.dumps(metadata["validation"], indent=1))
    return metadata


def _provenance(argv: Sequence[str], seed: int, config: object) -> dict:
    """What a stored model records of how it was made: the command, machine, date, versions, seed and
    the configuration."""
    return {
        "command": "python -m kltutorial.textrlhf " + shlex.join(argv),
        "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "versions": _versions(),
        "seed": seed,
        "config": asdict(config),
    }


def _unknown_share(tok, texts: Sequence[str]) -> float:
    ids = [i for row in tok(list(texts), add_special_tokens=False).input_ids for i in row]
    return sum(i == tok.unk_token_id for i in ids) / len(ids)


def _sweep(args: argparse.Namespace, argv: Sequence[str]) -> dict:
    model, tok = load_pretrained(args.model)
    configs = [TextTrainConfig(beta=b, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                               max_new_tokens=args.max_new_tokens) for b in args.betas]
    ref_stats, ref_texts = evaluate_policy(model, model, tok, n=args.eval, max_new_tokens=args.max_new_tokens,
                                           generator=torch.Generator().manual_seed(args.seed + 1))
    rows = [{"beta": None, **asdict(ref_stats), "seconds": 0.0, "samples": ref_texts[:8]}]
    for config in configs:
        run = train_text(model, tok, config, generator=torch.Generator().manual_seed(args.seed))
        stats, texts = evaluate_policy(run.policy, model, tok, n=args.eval,
                                       max_new_tokens=args.max_new_tokens,
                                       generator=torch.Generator().manual_seed(args.seed + 1))
        rows.append({"beta": config.beta, **asdict(stats), "seconds": round(run.seconds, 1),
                     "samples": texts[:8],
                     "history": {f: getattr(run, f).tolist() for f in ("gold", "kl", "k1", "k3",
                                                                       "distinct_2", "length")}})
        _print_row(rows[-1], header=len(rows) == 2, reference=rows[0])
    result = {
        "command": "python -m kltutorial.textrlhf " + shlex.join(argv),
        "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "versions": _versions(),
        "settings": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                     "max_new_tokens": args.max_new_tokens, "eval": args.eval, "seed": args.seed},
        "rows": rows,
    }
    for row in rows:
        print(f"\nbeta {row['beta']}:")
        for text in row["samples"][:4]:
            print("   ", text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf8")
    return result


def _print_row(row: dict, header: bool, reference: dict) -> None:
    if header:
        print(f"{'beta':>6} {'gold':>6} {'KL':>7} {'k1':>7} {'k3':>7} {'dist-1':>7} {'dist-2':>7} "
              f"{'length':>7} {'seconds':>8}")
        _print_row(reference, header=False, reference=reference)
    beta = "ref" if row["beta"] is None else f"{row['beta']:g}"
    print(f"{beta:>6} {row['gold']:>6.3f} {row['kl']:>7.2f} {row['k1']:>7.2f} {row['k3']:>7.2f} "
          f"{row['distinct_1']:>7.3f} {row['distinct_2']:>7.3f} {row['length']:>7.1f} {row['seconds']:>8.1f}",
          flush=True)


def main(argv: Sequence[str] | None = None) -> dict:
    """Parse ``argv`` (default: the process's) and run ``pretrain``, ``proxy`` or ``sweep``; return what it
    wrote."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m kltutorial.textrlhf",
                                     description="The real-text RLHF experiment: the base model and "
                                     "the β sweep.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pretrain", help="train the base model and store it (minutes on one thread)")
    p.add_argument("--out", default=str(PRETRAINED_DIR), help="directory to write (default: the package's)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the batches (default 0)")
    for f in fields(PretrainConfig):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=None,
                       help=f"default {f.default}")
    q = sub.add_parser("proxy", help="learn the proxy reward from the stored base model and store it")
    q.add_argument("--out", default=str(PROXY_DIR), help="directory to write (default: the package's)")
    q.add_argument("--model", default=None, help="a directory written by pretrain (default: the package's)")
    q.add_argument("--seed", type=int, default=0, help="seeds the samples, labels, head and batches")
    for f in fields(ProxyConfig):
        q.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=None,
                       help=f"default {f.default}")
    s = sub.add_parser("sweep", help="train one policy per β from the stored model and measure each")
    s.add_argument("--betas", type=float, nargs="+", default=list(TEXT_BETAS),
                   help="KL coefficients (default: " + " ".join(f"{b:g}" for b in TEXT_BETAS) + ")")
    s.add_argument("--steps", type=int, default=TextTrainConfig.steps)
    s.add_argument("--batch-size", type=int, default=TextTrainConfig.batch_size)
    s.add_argument("--lr", type=float, default=TextTrainConfig.lr)
    s.add_argument("--max-new-tokens", type=int, default=TextTrainConfig.max_new_tokens)
    s.add_argument("--eval", type=int, default=EVAL_SAMPLES, help="fresh samples measured per policy")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--model", default=None, help="a directory written by pretrain (default: the package's)")
    s.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    start = time.perf_counter()
    try:
        result = {"pretrain": _pretrain, "proxy": _proxy, "sweep": _sweep}[args.command](args, argv)
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    print(f"{args.command}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return result
