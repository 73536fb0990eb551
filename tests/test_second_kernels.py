"""tools/second_kernels.py: the environment of nbval's second pass really changes the kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools.second_kernels import probe, second_kernel_env

ROOT = Path(__file__).resolve().parents[1]


def test_second_kernel_set_takes_effect() -> None:
    native = probe(dict(os.environ))
    reduced = probe(second_kernel_env())
    assert reduced["torch"] == "DEFAULT"
    assert reduced["numpy_dispatch_in_use"] == []
    # On a CPU with any vector extension, the native run uses something else: the pass is a real second one.
    assert native["torch"] != "DEFAULT" or native["numpy_dispatch_in_use"]


def test_machine_setting_of_openblas_coretype_is_kept() -> None:
    assert second_kernel_env({"OPENBLAS_CORETYPE": "Haswell"})["OPENBLAS_CORETYPE"] == "Haswell"
    assert second_kernel_env({})["OPENBLAS_CORETYPE"] == "Prescott"


def test_runs_the_command_with_the_switches() -> None:
    out = subprocess.run(
        [sys.executable, "tools/second_kernels.py", "--", sys.executable, "-c",
         "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "DEFAULT"
    assert "second kernel set: ATEN_CPU_CAPABILITY='default'" in out.stdout


def test_usage_error() -> None:
    out = subprocess.run([sys.executable, "tools/second_kernels.py", "echo"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "usage:" in out.stderr
