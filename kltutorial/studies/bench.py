"""Time and memory of the log-prob kernels, and of the vectorised §10 simulation (book section 12).

Run ``python -m kltutorial.studies.bench`` (``--help`` for the options; ``--quick`` finishes in seconds).

What is measured
----------------
Log-probs of chosen tokens, for logits of shape (B, T, V):

========================  ==================================================================
``amax``                  one plain read of the logits, ``logits.amax(-1)``: the speed limit
``naive``                 ``log_softmax(logits).gather(...)`` (``naive_logprobs_for_tokens``)
``trl_row_loop``          TRL's ``selective_log_softmax`` strategy (``trl_style_logprobs``)
``ours``                  ``get_logprobs_for_tokens``: chunked, NaN check folded in
``ours+scan``             ``ours`` after ``_validation.check_float_tensor`` scans the input
========================  ==================================================================

and the exact KL over the vocabulary, ``naive_kl`` (``naive_exact_kl``: ``F.kl_div`` of two full
log-softmaxes) against ``ours_kl`` (``exact_kl``). With ``--backward`` also forward + backward of
``naive`` and ``ours`` (``*_fb``).

How
---
Every case (method, shape, dtype) runs in a fresh Python process, so that the memory it reports is its
own. The child process

1. allocates its inputs in place (``torch.empty`` then ``normal_`` one batch row at a time, so no
   temporary larger than one row is ever made) and runs the method once on a tiny input to load kernels
   and thread pools;
2. resets the kernel's record of its peak resident set size (``VmHWM`` in ``/proc/self/status``) to
   the current RSS, the inputs plus the interpreter, by writing ``5`` to ``/proc/self/clear_refs``;
3. runs the method ``repeats`` times, timing each call with ``time.perf_counter``;
4. reports the median time and *peak memory above the inputs*: ``VmHWM`` after minus before.

Every child runs with glibc's mmap threshold fixed at :data:`MMAP_THRESHOLD` (``MALLOC_MMAP_THRESHOLD_``),
so that every block of 256 KiB or more is mapped when allocated and unmapped when freed, and the peak counts
the bytes a method holds *at once*. With glibc's default, a *dynamic* threshold, the peak measured what
the allocator happened to keep: freeing a mapped block raises the threshold to that block's size (up to
32 MiB), so the next block of that size comes from the heap, and a freed heap block stays resident. Whether
a later block of the same size can reuse it depends on where unrelated small allocations landed, which
changes with ``PYTHONHASHSEED`` and the environment. For ``ours+scan`` at 2 x 512 x 32,000 float32 (its
boolean NaN mask is 31 MiB, a quarter of the logits) the peak was one mask in some runs and two in
others: 25 % of the logits or 50 %; for ``ours`` one 2 MiB chunk buffer or two (1.5 % or 3 %). With the
threshold fixed, repeated runs agree to a few tenths of a percent of the logits.

Each child uses one torch thread unless ``--threads`` says otherwise. On the shared 2-core machine where
this was written, two OpenMP threads were fine while the machine was quiet (``ours`` 0.032 s, ``naive``
0.14 s, ``amax`` 0.011 s at 4 x 1024 x 32,000 float32), but whenever other jobs kept the cores busy, every
parallel region waited for the second thread to be scheduled again (about 8 ms per region). A loop of
many cache-sized operations, like the chunked kernels, then took 2 s instead of 0.06 s, while one large
operation pays the wait once. ``OMP_WAIT_POLICY=PASSIVE`` or one thread removes the effect, so one thread
is the default: it measures the work rather than the neighbours. Pass ``--threads 2`` on a quiet machine.

``tracemalloc`` does not see PyTorch's allocations; RSS does. ``resource.getrusage(...).ru_maxrss`` is
not used: Linux carries it over from the parent across fork and exec, so a child started from a large
process (a Jupyter kernel) starts with the parent's peak and under-reports its own. Ratios (to ``naive``
and to ``amax``) compare numbers measured in the same invocation, which is what matters on a shared
machine.

The command also runs the simulation benchmark of :mod:`kltutorial.studies.bench_simulation` (the vectorised
§10 model against the handbook's one-run-at-a-time loop).

Randomness and process settings: the inputs come from a ``torch.Generator`` (logits) or a
``numpy.random.Generator`` (simulation) passed in; only the command line (:func:`main`) and the child
process's entry point create them from a seed, and only the child sets torch's thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kltutorial._validation import (
    check_choice,
    check_float_tensor,
    check_generator,
    check_positive,
    check_positive_int,
)
from kltutorial.logprobs import (
    CHUNK_BYTES,
    exact_kl,
    get_logprobs_for_tokens,
    naive_exact_kl,
    naive_logprobs_for_tokens,
)
from kltutorial.logprobs.hidden import (
    linear_exact_kl,
    linear_logprobs,
    naive_linear_exact_kl,
    naive_linear_logprobs,
    tile_shape,
)
from kltutorial.studies.bench_simulation import simulation_benchmark

__all__ = [
    "MMAP_THRESHOLD",
    "LOGPROB_METHODS",
    "KL_METHODS",
    "LINEAR_METHODS",
    "ALL_METHODS",
    "ALL_DTYPES",
    "BenchRow",
    "trl_style_logprobs",
    "measure",
    "run_case",
    "run_table",
    "chunk_sweep",
    "linear_table",
    "linear_vocab_sweep",
    "linear_tile_sweep",
    "format_table",
    "format_linear_table",
    "LinearRow",
    "LinearResults",
    "read_linear_results",
    "main",
]

FULL_SHAPES = [(4, 1024, 32_000), (2, 1024, 128_256)]
QUICK_SHAPES = [(2, 128, 4_096)]
DTYPES = ["float32", "bfloat16"]
#: The log-prob methods (the first table of the module docstring).
LOGPROB_METHODS = ["amax", "naive", "trl_row_loop", "ours", "ours+scan"]
#: The exact-KL methods.
KL_METHODS = ["naive_kl", "ours_kl"]
BACKWARD_METHODS = ["naive_fb", "ours_fb"]
#: From the hidden states, shape (N, H, V): the unfused recipe (``lin_naive``: ``hidden @ weight.T``, then
#: its log-softmax), the logits built and then chunked (``lin_chunked``: ``get_logprobs_for_tokens(hidden @
#: weight.T)``) and ``linear_logprobs`` (``lin_tiled``); each forward, and forward + backward (``*_fb``,
#: gradients of both ``hidden`` and ``weight``); and the exact KL, unfused and tiled (``lin_*_kl``).
LINEAR_METHODS = ["lin_naive", "lin_chunked", "lin_tiled", "lin_naive_fb", "lin_chunked_fb", "lin_tiled_fb",
                  "lin_naive_kl", "lin_tiled_kl"]
#: Every method a case may name: log-probs, exact KL, forward + backward (``*_fb``), from hidden states.
ALL_METHODS = LOGPROB_METHODS + KL_METHODS + BACKWARD_METHODS + LINEAR_METHODS
#: The shape of the issue's targets for the hidden-state functions: N positions, H, V.
LINEAR_SHAPE = (1024, 512, 32_000)
#: The dtypes a case may use.
ALL_DTYPES = ["float32", "bfloat16", "float16", "float64"]
#: Bytes from which glibc maps a block (and unmaps it when freed) in the benchmark's children; setting it
#: switches glibc's dynamic threshold off (see the module docstring). Below every chunk buffer (2 MiB).
MMAP_THRESHOLD = 256 << 10


# ----------------------------------------------------------------------------------------------------
# The baseline that TRL ships


def trl_style_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Baseline: the strategy of TRL's ``selective_log_softmax``, one batch row at a time.

    For float32/float64 it gathers the chosen logits and subtracts ``torch.logsumexp`` computed for
    one sequence (a (T, V) slice) at a time; for half precision it runs ``log_softmax`` per sequence in
    the input dtype. The per-row loop bounds the extra memory by one (T, V) slice, not by (B, T, V).

    Parameters
    ----------
    logits : Tensor, shape (B, T, V)
    tokens : Tensor, shape (B, T), integer

    Returns
    -------
    Tensor, shape (B, T)
    """
    if logits.dtype in (torch.float32, torch.float64):
        chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])  # (B, T)
        return chosen - lse
    rows = []
    for row_logits, row_tokens in zip(logits, tokens, strict=True):  # (T, V), (T,)
        row_logp = F.log_softmax(row_logits, dim=-1)
        rows.append(row_logp.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def _fwd_bwd(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = logits.detach().requires_grad_()
        fn(x, tokens).sum().backward()
        return x.grad

    return run


def _method(name: str, chunk_size: int | None) -> Callable[[dict[str, torch.Tensor]], object]:
    """The callable timed for ``name``; it takes the dict of inputs made by ``_make_inputs``."""
    if name == "amax":
        return lambda d: d["logits"].amax(-1)
    if name == "naive":
        return lambda d: naive_logprobs_for_tokens(d["logits"], d["tokens"])
    if name == "trl_row_loop":
        return lambda d: trl_style_logprobs(d["logits"], d["tokens"])
    if name == "ours":
        return lambda d: get_logprobs_for_tokens(d["logits"], d["tokens"], chunk_size=chunk_size)
    if name == "ours+scan":

        def scan_then_ours(d: dict[str, torch.Tensor]) -> torch.Tensor:
            check_float_tensor(d["logits"], "logits", ndim=3, allow_inf=True)
            return get_logprobs_for_tokens(d["logits"], d["tokens"], chunk_size=chunk_size)

        return scan_then_ours
    if name == "naive_kl":
        return lambda d: naive_exact_kl(d["logits"], d["reference"])
    if name == "ours_kl":
        return lambda d: exact_kl(d["logits"], d["reference"], chunk_size=chunk_size)
    if name == "naive_fb":
        return lambda d: _fwd_bwd(naive_logprobs_for_tokens)(d["logits"], d["tokens"])
    if name == "ours_fb":
        fn = _fwd_bwd(lambda x, t: get_logprobs_for_tokens(x, t, chunk_size=chunk_size))
        return lambda d: fn(d["logits"], d["tokens"])
    if name in LINEAR_METHODS:
        return _linear_method(name, chunk_size)
    raise ValueError(f"method must be one of {ALL_METHODS}, got {name!r}")


def _linear_method(name: str, chunk_size: int | tuple[int, int] | None
                   ) -> Callable[[dict[str, torch.Tensor]], object]:
    """The callable timed for a ``lin_*`` method: forward, or forward + backward returning both gradients."""
    forward = {
        "lin_naive": lambda h, w, y: naive_linear_logprobs(h, w, y),
        "lin_chunked": lambda h, w, y: get_logprobs_for_tokens(h @ w.T, y),
        "lin_tiled": lambda h, w, y: linear_logprobs(h, w, y, chunk_size=chunk_size),
    }
    base = name.removesuffix("_fb")
    if name == "lin_naive_kl":
        return lambda d: naive_linear_exact_kl(d["hidden"], d["weight"], d["ref_hidden"], d["ref_weight"])
    if name == "lin_tiled_kl":
        return lambda d: linear_exact_kl(d["hidden"], d["weight"], d["ref_hidden"], d["ref_weight"],
                                         chunk_size=chunk_size)
    if name == base:
        return lambda d: forward[base](d["hidden"], d["weight"], d["tokens"])

    def fwd_bwd(d: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        h, w = d["hidden"].detach().requires_grad_(), d["weight"].detach().requires_grad_()
        forward[base](h, w, d["tokens"]).sum().backward()
        return h.grad, w.grad

    return fwd_bwd


def _check_case(
    method: str, shape: Sequence[int], dtype: str, repeats: int, chunk_size: int | Sequence[int] | None
) -> tuple[int, int, int]:
    """Check one benchmark case; return the shape as (B, T, V), or (N, H, V) for a ``lin_*`` method."""
    check_choice(method, "method", ALL_METHODS)
    check_choice(dtype, "dtype", ALL_DTYPES)
    linear = method in LINEAR_METHODS
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or len(shape) != 3:
        sizes = "(N, H, V)" if linear else "(B, T, V)"
        raise ValueError(f"shape: expected three sizes {sizes}, got {shape!r}")
    B, T, V = (check_positive_int(n, f"shape[{i}]") for i, n in enumerate(shape))
    check_positive_int(repeats, "repeats")
    if chunk_size is not None:
        if linear:
            tile_shape(tuple(chunk_size) if isinstance(chunk_size, Sequence) else chunk_size)
        else:
            check_positive_int(chunk_size, "chunk_size")
    return B, T, V


# ----------------------------------------------------------------------------------------------------
# One case, in the current process (the child)


def _random_logits(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    x = torch.empty(tuple(shape), dtype=dtype)
    for row in x:  # in place, one (T, V) slice at a time: no full-size temporary
        row.normal_(generator=generator).mul_(2.0)
    return x


def _make_inputs(
    shape: Sequence[int], dtype: torch.dtype, with_reference: bool, g: torch.Generator
) -> dict[str, torch.Tensor]:
    B, T, V = shape
    inputs = {
        "logits": _random_logits(shape, dtype, g),
        "tokens": torch.randint(0, V, (B, T), generator=g),
    }
    if with_reference:
        inputs["reference"] = _random_logits(shape, dtype, g)
    return inputs


def _make_linear_inputs(
    shape: Sequence[int], dtype: torch.dtype, with_reference: bool, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """hidden (N, H) and weight (V, H) whose logits have a standard deviation of about 2, and tokens."""
    N, H, V = shape
    inputs = {
        "hidden": torch.randn(N, H, generator=g).mul_(2.0 / math.sqrt(H)).to(dtype),
        "weight": torch.randn(V, H, generator=g).to(dtype),
        "tokens": torch.randint(0, V, (N,), generator=g),
    }
    if with_reference:
        inputs["ref_hidden"] = torch.randn(N, H, generator=g).mul_(2.0 / math.sqrt(H)).to(dtype)
        inputs["ref_weight"] = torch.randn(V, H, generator=g).to(dtype)
    return inputs


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process image (Linux ``VmHWM``)."""
    return _status_kib("VmHWM") * 1024


def _reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(
    method: str,
    shape: Sequence[int],
    dtype: str,
    repeats: int = 5,
    chunk_size: int | tuple[int, int] | None = None,
    *,
    generator: torch.Generator,
) -> dict[str, float]:
    """Time one method and measure its peak memory above the inputs, in *this* process.

    Meant to run in a fresh process (see :func:`run_case`): the peak RSS is per process and never
    goes down, so a second measurement in the same process would see the first one's peak. It resets
    this process's record of its peak RSS (steps 1–4 of the module docstring).

    Parameters
    ----------
    method : str
        One of :data:`ALL_METHODS`.
    shape : (B, T, V)
    dtype : str
        ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"float64"``.
    repeats : int
        Timed calls.
    chunk_size : int or (int, int), optional
        Rows per chunk for ``ours``, or the tile for ``lin_tiled`` (default: the package's choice).
    generator : torch.Generator
        Source of the random logits (or hidden states and weights) and tokens.

    Returns
    -------
    dict
        ``times`` (seconds, one per repeat), ``peak_bytes`` (peak RSS above the inputs),
        ``input_bytes`` (size of one logits tensor: for a ``lin_*`` method, the (N, V) logits that
        ``hidden @ weight.T`` makes) and, for a ``lin_*_fb`` method, ``grad_bytes``: the gradients of
        ``hidden`` and ``weight`` that it returns (in the peak, but not extra memory).
    """
    shape = _check_case(method, shape, dtype, repeats, chunk_size)
    generator = check_generator(generator)
    torch_dtype = getattr(torch, dtype)
    if isinstance(chunk_size, Sequence):
        chunk_size = tuple(chunk_size)
    fn = _method(method, chunk_size)
    linear = method in LINEAR_METHODS
    kl = method in KL_METHODS or method.endswith("_kl")
    make = _make_linear_inputs if linear else _make_inputs
    # warm up kernels and thread pools on a tiny input (its memory is part of the baseline)
    fn(make((4, min(shape[1], 64), min(shape[2], 4096)) if linear else (1, 4, min(shape[2], 4096)),
            torch_dtype, kl, generator))
    inputs = make(shape, torch_dtype, kl, generator)
    _reset_peak_rss()
    before = _peak_rss_bytes()
    times = []
    returned = 0
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(inputs)
        times.append(time.perf_counter() - start)
        outs = out if isinstance(out, tuple) else (out,)
        returned = sum(t.numel() * t.element_size() for t in outs)
        del out, outs
    element = torch.empty(0, dtype=torch_dtype).element_size()
    result = {
        "times": times,
        "peak_bytes": _peak_rss_bytes() - before,
        # one logits tensor: (B, T, V) as given, or the (N, V) that hidden @ weight.T would make
        "input_bytes": (shape[0] * shape[2] if linear else math.prod(shape)) * element,
    }
    if linear and method.endswith("_fb"):
        result["grad_bytes"] = returned  # the gradients of hidden and weight, which any method returns
    return result


# ----------------------------------------------------------------------------------------------------
# Many cases, each in a child process


@dataclass(frozen=True)
class BenchRow:
    """One line of the table. Ratios are to ``naive``/``naive_kl`` and to ``amax`` of the same run."""

    task: str
    method: str
    shape: tuple[int, int, int]
    dtype: str
    median_s: float
    peak_mib: float
    peak_frac: float  # peak memory above the inputs / bytes of one logits tensor
    vs_naive: float = math.nan
    vs_amax: float = math.nan


def run_case(
    method: str,
    shape: Sequence[int],
    dtype: str,
    repeats: int = 5,
    threads: int | None = 1,
    chunk_size: int | tuple[int, int] | None = None,
    timeout: float = 900.0,
) -> dict[str, float]:
    """Run :func:`measure` in a fresh Python process and return its result.

    ``threads`` sets ``torch.set_num_threads`` in the child (``None``: torch's default); the child draws
    its inputs from ``torch.Generator().manual_seed(0)`` and runs with glibc's mmap threshold fixed at
    :data:`MMAP_THRESHOLD` (``MALLOC_MMAP_THRESHOLD_``), so that its peak does not depend on what the
    allocator kept from an earlier call.
    """
    _check_case(method, shape, dtype, repeats, chunk_size)
    if threads is not None:
        check_positive_int(threads, "threads")
    timeout = check_positive(timeout, "timeout")
    spec = {"method": method, "shape": list(shape), "dtype": dtype, "repeats": repeats,
            "chunk_size": chunk_size, "threads": threads}
    proc = subprocess.run(
        [sys.executable, "-m", "kltutorial.studies.bench", "--child", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {spec} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child(spec_json: str) -> None:
    """Entry point of the child process: its own thread count and generator, one :func:`measure`."""
    spec = json.loads(spec_json)
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    generator = torch.Generator().manual_seed(spec.get("seed", 0))
    result = measure(spec["method"], spec["shape"], spec["dtype"], spec["repeats"], spec["chunk_size"],
                     generator=generator)
    print(json.dumps(result))


def run_table(
    shapes: Sequence[Sequence[int]] = tuple(FULL_SHAPES),
    dtypes: Sequence[str] = tuple(DTYPES),
    methods: Sequence[str] = tuple(LOGPROB_METHODS + KL_METHODS),
    repeats: int = 5,
    threads: int | None = 1,
    chunk_size: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Measure every (shape, dtype, method), each in a fresh process; ratios within a (shape, dtype)."""
    for shape in shapes:  # every case is checked before the first one runs
        for dtype in dtypes:
            for method in methods:
                _check_case(method, shape, dtype, repeats, chunk_size)
    rows: list[BenchRow] = []
    for shape in shapes:
        for dtype in dtypes:
            raw = {}
            for method in methods:
                if progress is not None:
                    progress(f"{method} {tuple(shape)} {dtype}")
                raw[method] = run_case(method, shape, dtype, repeats, threads, chunk_size)
            med = {m: statistics.median(r["times"]) for m, r in raw.items()}
            for method, r in raw.items():
                task = "exact KL" if method in KL_METHODS else (
                    "fwd+bwd" if method in BACKWARD_METHODS else "log-probs")
                naive = {"exact KL": "naive_kl", "fwd+bwd": "naive_fb"}.get(task, "naive")
                rows.append(BenchRow(
                    task=task, method=method, shape=tuple(shape), dtype=dtype, median_s=med[method],
                    peak_mib=r["peak_bytes"] / 2**20, peak_frac=r["peak_bytes"] / r["input_bytes"],
                    vs_naive=med[method] / med[naive] if naive in med else math.nan,
                    vs_amax=med[method] / med["amax"] if "amax" in med else math.nan,
                ))
    return rows


def format_table(rows: Sequence[BenchRow]) -> str:
    """The rows as a fixed-width text table."""
    head = f"{'task':<10}{'method':<14}{'shape':<20}{'dtype':<10}{'median s':>10}{'peak MiB':>10}" \
           f"{'peak/logits':>13}{'/naive':>8}{'/amax':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        shape = "x".join(str(s) for s in r.shape)
        lines.append(
            f"{r.task:<10}{r.method:<14}{shape:<20}{r.dtype:<10}{r.median_s:>10.4f}{r.peak_mib:>10.1f}"
            f"{100 * r.peak_frac:>12.1f}%{r.vs_naive:>8.2f}{r.vs_amax:>8.2f}"
        )
    return "\n".join(lines)


def chunk_sweep(
    vocab_sizes: Sequence[int] = (32_000, 128_256),
    chunk_kib: Sequence[int] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    n_positions: int = 4096,
    dtype: str = "float32",
    method: str = "ours",
    repeats: int = 5,
    threads: int | None = 1,
) -> list[dict[str, float]]:
    """Median and minimum time of ``method`` for chunks of about ``chunk_kib`` KiB (float32) each.

    Each point runs in a fresh process on logits of shape (1, n_positions, V).
    """
    for vocab in vocab_sizes:
        for kib in chunk_kib:
            _check_case(method, (1, n_positions, vocab), dtype, repeats, check_positive_int(kib, "chunk_kib"))
    out = []
    for vocab in vocab_sizes:
        for kib in chunk_kib:
            rows = max(1, kib * 1024 // (4 * vocab))
            r = run_case(method, (1, n_positions, vocab), dtype, repeats, threads, chunk_size=rows)
            out.append({"vocab": vocab, "chunk_kib": kib, "rows": rows,
                        "median_s": statistics.median(r["times"]), "min_s": min(r["times"]),
                        "peak_mib": r["peak_bytes"] / 2**20})
    return out


# ----------------------------------------------------------------------------------------------------
# From the hidden states


def _linear_task(method: str) -> tuple[str, str]:
    """(task, its baseline method) of a ``lin_*`` method."""
    if method.endswith("_kl"):
        return "exact KL", "lin_naive_kl"
    if method.endswith("_fb"):
        return "fwd+bwd", "lin_naive_fb"
    return "log-probs", "lin_naive"


@dataclass(frozen=True)
class LinearRow:
    """One line of the ``lin_*`` table.

    ``median_s`` and ``min_s`` are over every timed call of every round; ``vs_unfused`` is the median,
    over the rounds, of this method's fastest call over the unfused method's fastest call in the same
    round (rounds interleave the methods, so a change in the machine's load between rounds cancels);
    ``extra_mib`` / ``extra_frac``: the largest peak above the inputs and the returned gradients, in MiB
    and as a fraction of the (N, V) logits.
    """

    task: str
    method: str
    shape: tuple[int, int, int]
    dtype: str
    median_s: float
    min_s: float
    vs_unfused: float
    extra_mib: float
    extra_frac: float


def linear_table(
    shape: Sequence[int] = LINEAR_SHAPE,
    dtype: str = "float32",
    methods: Sequence[str] = tuple(LINEAR_METHODS),
    repeats: int = 3,
    threads: int | None = 1,
    chunk_size: int | tuple[int, int] | None = None,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[LinearRow]:
    """Time and extra memory of the ``lin_*`` methods at ``shape`` = (N, H, V), each case in a fresh process.

    Every round runs each method once (a fresh process, ``repeats`` timed calls), in order, so that the
    methods share the machine's load; see :class:`LinearRow` for what each column means. The returned
    gradients (of ``hidden`` and ``weight``, which every method must return) are not counted as extra.
    """
    for method in methods:
        if method not in LINEAR_METHODS:
            raise ValueError(f"methods must be among {LINEAR_METHODS}, got {method!r}")
        _check_case(method, shape, dtype, repeats, chunk_size)
    rounds = check_positive_int(rounds, "rounds")
    raw: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for k in range(rounds):
        for method in methods:
            if progress is not None:
                progress(f"{method} {tuple(shape)} {dtype} (round {k + 1} of {rounds})")
            raw[method].append(run_case(method, shape, dtype, repeats, threads, chunk_size))
    rows = []
    for method, runs in raw.items():
        base = _linear_task(method)[1]
        ratios = [min(r["times"]) / min(b["times"]) for r, b in zip(runs, raw[base], strict=True)] \
            if base in raw else [math.nan]
        times = [t for r in runs for t in r["times"]]
        extra = max(r["peak_bytes"] - r.get("grad_bytes", 0) for r in runs)
        rows.append(LinearRow(task=_linear_task(method)[0], method=method, shape=tuple(shape), dtype=dtype,
                              median_s=statistics.median(times), min_s=min(times),
                              vs_unfused=statistics.median(ratios), extra_mib=extra / 2**20,
                              extra_frac=extra / runs[0]["input_bytes"]))
    return rows


def linear_vocab_sweep(
    vocab_sizes: Sequence[int] = (32_000, 64_000, 128_000, 256_000),
    n_positions: int = 1024,
    hidden_size: int = 512,
    methods: Sequence[str] = ("lin_naive_fb", "lin_chunked_fb", "lin_tiled_fb"),
    repeats: int = 1,
    threads: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> list[LinearRow]:
    """Extra peak memory (and time) of forward + backward against V, for the unfused recipe, the logits
    chunked, and the tiles from the hidden states; one fresh process per (method, V), one round."""
    rows = []
    for vocab in vocab_sizes:
        rows.extend(linear_table((n_positions, hidden_size, vocab), "float32", methods, repeats, threads,
                                 rounds=1, progress=progress))
    return rows


def linear_tile_sweep(
    tiles: Sequence[tuple[int, int]] = ((64, 1024), (128, 1024), (256, 512), (256, 1024), (256, 2048),
                                        (512, 1024), (1024, 256), (1024, 1024)),
    shape: Sequence[int] = LINEAR_SHAPE,
    method: str = "lin_tiled_fb",
    repeats: int = 3,
    threads: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, float]]:
    """Fastest time, ratio to the unfused method and extra peak of ``method`` for each (positions,
    vocabulary) tile; the unfused method runs before each tile (fresh processes), for the ratio."""
    baseline = _linear_task(method)[1]
    out = []
    for tile in tiles:
        if progress is not None:
            progress(f"{method} tile {tuple(tile)}")
        base = run_case(baseline, shape, "float32", repeats, threads)
        r = run_case(method, shape, "float32", repeats, threads, tuple(tile))
        extra = r["peak_bytes"] - r.get("grad_bytes", 0)
        out.append({"rows": tile[0], "cols": tile[1], "tile_mib": tile[0] * tile[1] * 4 / 2**20,
                    "min_s": min(r["times"]), "vs_unfused": min(r["times"]) / min(base["times"]),
                    "extra_mib": extra / 2**20, "extra_frac": extra / r["input_bytes"]})
    return out


def format_linear_table(rows: Sequence[LinearRow]) -> str:
    """``lin_*`` rows as a fixed-width table (85 columns): times, ratio to the unfused method, extra peak."""
    head = f"{'task':<10}{'method':<15}{'N x H x V':<16}{'median s':>9}{'min s':>8}{'/unfused':>9}" \
           f"{'extra MiB':>10}{'/logits':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        shape = "x".join(str(s) for s in r.shape)
        lines.append(f"{r.task:<10}{r.method:<15}{shape:<16}{r.median_s:>9.3f}{r.min_s:>8.3f}"
                     f"{r.vs_unfused:>9.2f}{r.extra_mib:>10.1f}{100 * r.extra_frac:>7.1f}%")
    return "\n".join(lines)


@dataclass(frozen=True)
class LinearResults:
    """What ``python -m kltutorial.studies.bench --linear --json FILE`` stored (:func:`read_linear_results`).

    Attributes
    ----------
    settings : dict
        torch version, threads per process, default tile, shape (N, H, V), rounds, repeats, CPU, cores,
        load average before the run and the date (UTC).
    table : list of LinearRow
        Every ``lin_*`` method at the shape.
    by_vocab : list of LinearRow
        Forward + backward of the three methods at each vocabulary size.
    """

    settings: dict
    table: list[LinearRow]
    by_vocab: list[LinearRow]


def read_linear_results(path: str | Path) -> LinearResults:
    """Read the JSON that ``--linear --json`` wrote."""
    with open(path, encoding="utf8") as f:
        data = json.load(f)

    def rows(key: str) -> list[LinearRow]:
        return [LinearRow(**{**r, "shape": tuple(r["shape"])}) for r in data[key]]

    settings = {k: v for k, v in data.items() if k not in ("table", "by_vocab", "tile_sweep")}
    return LinearResults(settings=settings, table=rows("table"), by_vocab=rows("by_vocab"))


# ----------------------------------------------------------------------------------------------------
# Command line


def _parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape must look like 4x1024x32000 (B x T x V), got {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: ``python -m kltutorial.studies.bench``."""
    parser = argparse.ArgumentParser(
        prog="python -m kltutorial.studies.bench",
        description="Time and peak memory of the log-prob / exact-KL kernels (each case in a fresh "
                    "process), and the vectorised section-10 simulation against a scalar loop.")
    parser.add_argument("--quick", action="store_true",
                        help=f"small shapes {QUICK_SHAPES} and a small simulation (seconds)")
    parser.add_argument("--shapes", type=_parse_shape, nargs="+", metavar="BxTxV",
                        help="logit shapes (default: 4x1024x32000 2x1024x128256)")
    parser.add_argument("--dtypes", nargs="+", choices=ALL_DTYPES,
                        default=DTYPES)
    parser.add_argument("--methods", nargs="+", choices=ALL_METHODS,
                        help="methods to run (default: all forward methods)")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case (median reported)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in each child (default 1; see the module docstring)")
    parser.add_argument("--chunk-size", type=int, default=None, help="rows per chunk for ours")
    parser.add_argument("--sweep", action="store_true", help="sweep the chunk size (with --linear: the tile)")
    parser.add_argument("--linear", action="store_true",
                        help="the functions from hidden states: the table at N x H x V = 1024 x 512 x 32000 "
                             "(--shapes NxHxV to change), and the peak against V from 32k to 256k")
    parser.add_argument("--json", metavar="FILE", help="with --linear: also write the results as JSON")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --linear: rounds of the table, each running every method once")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulation benchmark")
    parser.add_argument("--sim-only", action="store_true", help="only the simulation benchmark")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulation's disturbances")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        _child(args.child)
        return

    def say(msg: str) -> None:
        print(f"  running {msg}", file=sys.stderr, flush=True)

    print(f"torch {torch.__version__}, threads per child: {args.threads}, "
          f"load average {os.getloadavg()[0]:.1f}, CHUNK_BYTES {CHUNK_BYTES}")
    if args.linear:
        _linear_main(args, say)
        return
    if args.sweep:
        sizes = (4096,) if args.quick else (32_000, 128_256)
        for r in chunk_sweep(sizes, repeats=args.repeats, threads=args.threads,
                             n_positions=512 if args.quick else 2048,
                             dtype=args.dtypes[0], method=(args.methods or ["ours"])[0]):
            print(f"V={r['vocab']:>7}  chunk {r['chunk_kib']:>6} KiB = {r['rows']:>5} rows  "
                  f"median {r['median_s']:.4f} s  min {r['min_s']:.4f} s  peak {r['peak_mib']:.1f} MiB")
        return
    if not args.sim_only:
        methods = args.methods or (LOGPROB_METHODS + KL_METHODS)
        if args.backward:
            methods = list(methods) + [m for m in BACKWARD_METHODS if m not in methods]
        shapes = args.shapes or (QUICK_SHAPES if args.quick else FULL_SHAPES)
        rows = run_table(shapes, args.dtypes, methods, args.repeats, args.threads, args.chunk_size,
                         progress=say)
        print(format_table(rows))
    if not args.no_sim:
        sim = simulation_benchmark(n_seeds=100 if args.quick else 1000, repeats=1 if args.quick else 3,
                                   rng=np.random.default_rng(args.seed))
        print(f"\nsimulation: {sim['n_betas']} beta x {sim['n_seeds']} seeds x {sim['n_steps']} steps: "
              f"vectorised {sim['vectorised_s']:.4f} s, scalar loop (baseline) {sim['loop_s']:.3f} s, "
              f"speed-up {sim['speedup']:.0f}x, max |difference| {sim['max_abs_diff']:.1e}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _linear_main(args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """``--linear``: the table, the tile sweep (``--sweep``) or the peak against V, printed (and saved)."""
    shape = args.shapes[0] if args.shapes else ((256, 128, 8_000) if args.quick else LINEAR_SHAPE)
    results: dict[str, object] = {
        "torch": torch.__version__, "threads": args.threads, "tile": list(tile_shape()), "shape": list(shape),
        "rounds": args.rounds, "repeats": args.repeats, "cpu": _cpu_model(), "cores": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 1), "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if args.sweep:
        sweep = linear_tile_sweep(shape=shape, repeats=args.repeats, threads=args.threads, progress=say)
        for r in sweep:
            print(f"tile {r['rows']:>5} x {r['cols']:>5} ({r['tile_mib']:5.2f} MiB)  "
                  f"min {r['min_s']:.3f} s  /unfused {r['vs_unfused']:.2f}  "
                  f"extra {r['extra_mib']:6.1f} MiB ({100 * r['extra_frac']:.1f}%)")
        results["tile_sweep"] = sweep
    else:
        rows = linear_table(shape, args.dtypes[0], LINEAR_METHODS, args.repeats, args.threads,
                            rounds=args.rounds, progress=say)
        print(format_linear_table(rows))
        vocab = (8_000, 16_000, 32_000) if args.quick else (32_000, 64_000, 128_000, 256_000)
        by_vocab = linear_vocab_sweep(vocab, shape[0], shape[1], threads=args.threads, progress=say)
        print("\nextra peak memory of forward + backward against V (returned gradients not counted)")
        print(format_linear_table(by_vocab))
        results["table"] = [vars(r) | {"shape": list(r.shape)} for r in rows]
        results["by_vocab"] = [vars(r) | {"shape": list(r.shape)} for r in by_vocab]
    if args.json:
        with open(args.json, "w", encoding="utf8") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
