"""Tests of kltutorial.studies.bench: the baselines compute what they claim to, and bad cases fail before
any run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial.logprobs import CHUNK_BYTES, naive_logprobs_for_tokens
from kltutorial.studies import bench, bench_simulation
from kltutorial.studies.dynamics import TrainingNoise, draw_training_noise, simulate_training_trajectory


def test_trl_style_baseline_matches_naive():
    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(3, 7, 64, generator=g)
    tokens = torch.randint(0, 64, (3, 7), generator=g)
    torch.testing.assert_close(bench.trl_style_logprobs(z, tokens), naive_logprobs_for_tokens(z, tokens))
    zb = z.bfloat16()
    torch.testing.assert_close(bench.trl_style_logprobs(zb, tokens), naive_logprobs_for_tokens(zb, tokens))


# ----------------------------------------------------------------------------------------------------
# Simulation benchmark


def test_scalar_baseline_first_steps_by_hand():
    kl, reward = bench_simulation.scalar_training_trajectory(
        0.25, np.array([1.0, -4.0]), np.array([0.0, 1.0]), noise_scale=0.5)
    # KL* = 6: KL_1 = 0.08 * 6 + 0.5 = 0.98, KL_2 = max(0, 0.98 + 0.08 * 5.02 - 2) = 0.
    np.testing.assert_allclose(kl, [0.0, 0.98, 0.0], atol=1e-15)
    np.testing.assert_allclose(reward, [0.0, 2 * (1 - math.exp(-0.196)), 0.5], atol=1e-15)


def test_scalar_baseline_equals_the_vectorised_simulation():
    noise = draw_training_noise(3, 40, np.random.default_rng(0))
    res = simulate_training_trajectory([0.0, 0.5], noise=noise)
    for k, beta in enumerate([0.0, 0.5]):
        for n in range(3):
            kl, reward = bench_simulation.scalar_training_trajectory(beta, noise.kl[n], noise.reward[n])
            np.testing.assert_array_equal(kl, res.kl[k, n])
            np.testing.assert_allclose(reward, res.reward[k, n], rtol=1e-13, atol=1e-14)


def test_simulation_benchmark():
    result = bench_simulation.simulation_benchmark(betas=(0.0, 0.5), n_seeds=4, n_steps=30, repeats=1,
                                        rng=np.random.default_rng(0))
    assert result["max_abs_diff"] < 1e-9
    assert (result["n_betas"], result["n_seeds"], result["n_steps"]) == (2, 4, 30)
    assert result["vectorised_s"] > 0 and result["loop_s"] > 0
    assert result["speedup"] == pytest.approx(result["loop_s"] / result["vectorised_s"])
    with pytest.raises(TypeError, match="rng"):
        bench_simulation.simulation_benchmark(n_seeds=2, n_steps=3, rng=0)
    with pytest.raises(TypeError, match="rng"):
        # randomness is passed in, never made here
        bench_simulation.simulation_benchmark(n_seeds=2, n_steps=3)
    with pytest.raises(ValueError, match="n_seeds"):
        bench_simulation.simulation_benchmark(n_seeds=0, rng=np.random.default_rng(0))


def test_scalar_baseline_needs_one_disturbance_of_each_kind_per_step():
    noise = TrainingNoise(kl=np.zeros((1, 3)), reward=np.zeros((1, 3)))
    with pytest.raises(ValueError):
        bench_simulation.scalar_training_trajectory(0.1, noise.kl[0], noise.reward[0, :2])


# ----------------------------------------------------------------------------------------------------
# Log-prob benchmark


def test_run_case_in_a_child_process():
    result = bench.run_case("ours", (1, 4, 64), "float32", repeats=2)
    assert set(result) == {"times", "peak_bytes", "input_bytes"}
    assert len(result["times"]) == 2 and all(t > 0 for t in result["times"])
    assert result["input_bytes"] == 1 * 4 * 64 * 4  # one float32 logits tensor


def test_run_case_fixes_the_allocator_threshold_in_the_child(monkeypatch):
    """The child's peak memory must not depend on what glibc kept from earlier calls (see bench)."""
    import subprocess

    seen = {}

    def fake_run(cmd, **kwargs):
        seen.update(kwargs["env"])
        line = '{"times": [1.0], "peak_bytes": 0, "input_bytes": 1024}'
        return subprocess.CompletedProcess(cmd, 0, stdout=line + "\n", stderr="")

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1")  # a caller's own value does not leak through
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    bench.run_case("ours", (1, 4, 64), "float32", repeats=1)
    assert seen["MALLOC_MMAP_THRESHOLD_"] == str(bench.MMAP_THRESHOLD)
    # below a chunk buffer, so that every chunk-sized block is mapped and unmapped, never kept
    assert bench.MMAP_THRESHOLD < CHUNK_BYTES


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"method": "fast"}, ValueError, "method"),
        ({"dtype": "int8"}, ValueError, "dtype"),
        ({"shape": (4, 64)}, ValueError, "shape"),
        ({"shape": (1, 0, 64)}, ValueError, r"shape\[1\]"),
        ({"repeats": 0}, ValueError, "repeats"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
    ],
)
def test_bad_cases_fail_before_running(kwargs, error, name):
    case = {"method": "ours", "shape": (1, 4, 64), "dtype": "float32", "repeats": 1} | kwargs
    with pytest.raises(error, match=name):
        bench.run_case(**case)
    with pytest.raises(error, match=name):
        bench.measure(**case, generator=torch.Generator().manual_seed(0))


def test_measure_takes_a_generator():
    with pytest.raises(TypeError, match="generator"):
        bench.measure("ours", (1, 4, 64), "float32", generator=0)


def test_run_table_checks_every_case_first():
    with pytest.raises(ValueError, match="dtype"):
        bench.run_table(shapes=[(1, 4, 64)], dtypes=["float32", "float8"], methods=["amax"])


def test_format_table():
    row = bench.BenchRow(task="log-probs", method="ours", shape=(1, 4, 64), dtype="float32",
                         median_s=0.5, peak_mib=2.0, peak_frac=0.25, vs_naive=0.5, vs_amax=2.0)
    lines = bench.format_table([row]).splitlines()
    assert len(lines) == 3 and lines[0].split()[:2] == ["task", "method"]
    assert lines[2].split() == ["log-probs", "ours", "1x4x64", "float32", "0.5000", "2.0", "25.0%",
                                "0.50", "2.00"]


# ----------------------------------------------------------------------------------------------------
# From the hidden states


@pytest.mark.parametrize("method", ["lin_naive", "lin_chunked", "lin_tiled", "lin_naive_kl", "lin_tiled_kl"])
def test_linear_methods_compute_the_same_numbers(method):
    g = torch.Generator().manual_seed(0)
    d = bench._make_linear_inputs((6, 8, 50), torch.float64, True, g)
    out = bench._method(method, (4, 16))(d)
    if method.endswith("_kl"):
        want = bench.naive_linear_exact_kl(d["hidden"], d["weight"], d["ref_hidden"], d["ref_weight"])
    else:
        want = bench.naive_linear_logprobs(d["hidden"], d["weight"], d["tokens"])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_linear_forward_backward_returns_both_gradients():
    g = torch.Generator().manual_seed(0)
    d = bench._make_linear_inputs((6, 8, 50), torch.float64, False, g)
    ours = bench._method("lin_tiled_fb", (4, 16))(d)
    naive = bench._method("lin_naive_fb", None)(d)
    assert [t.shape for t in ours] == [(6, 8), (50, 8)]
    for a, b in zip(ours, naive, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_linear_memory_in_child_processes():
    """Forward + backward at N x H x V = 512 x 64 x 16,000 (float32 logits: 31 MiB), each in a fresh
    process: the unfused recipe holds more than the logits on top of the gradients it returns; the tiles
    hold a few MiB (two 1 MiB tiles and the allocator's and BLAS's own)."""
    rows = bench.linear_table((512, 64, 16_000), methods=["lin_naive_fb", "lin_tiled_fb"], repeats=1,
                              rounds=1)
    extra = {r.method: r.extra_frac for r in rows}
    assert extra["lin_naive_fb"] > 1.0
    assert extra["lin_tiled_fb"] < 0.15
    assert rows[0].vs_unfused == 1.0 and rows[1].vs_unfused > 0 and rows[1].min_s <= rows[1].median_s
    lines = bench.format_linear_table(rows).splitlines()
    assert len(lines) == 4 and lines[3].split()[:3] == ["fwd+bwd", "lin_tiled_fb", "512x64x16000"]
    assert max(len(line) for line in lines) <= 88  # a notebook prints it


def test_linear_cases_are_checked():
    with pytest.raises(ValueError, match="chunk_size"):
        bench.run_case("lin_tiled", (4, 8, 50), "float32", chunk_size=(4, 0))
    with pytest.raises(ValueError, match=r"\(N, H, V\)"):
        bench.run_case("lin_tiled", (4, 50), "float32")
    with pytest.raises(ValueError, match="methods"):
        bench.linear_table((4, 8, 50), methods=["ours"])
