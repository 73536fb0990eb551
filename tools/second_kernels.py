"""Run a command on a second set of floating-point kernels: ``python tools/second_kernels.py -- CMD ...``.

The stored notebook outputs come from whatever CPU last ran ``make notebooks``; a reader's CPU, or
CI's, may pick other vector kernels and differ in the last bit. ``make test`` therefore runs nbval
twice: once on this machine's native kernels and once on the kernels this script selects, so that an
output which only the producing CPU reproduces fails here, before CI.

The switches, each the library's own:

* ``ATEN_CPU_CAPABILITY=default``: torch's ATen operators use their scalar (non-vectorised) kernels.
* ``NPY_DISABLE_CPU_FEATURES``: every feature group NumPy dispatches at run time on this build
  (``X86_V3 X86_V4 AVX512_ICL AVX512_SPR`` on x86-64), so its loops fall back to the baseline.
* ``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` and ``ONEDNN_MAX_CPU_ISA=SSE41``: torch's BLAS (MKL) and oneDNN
  primitives on their SSE code paths.
* ``OPENBLAS_CORETYPE=Prescott``: NumPy's BLAS (OpenBLAS) on its oldest x86 kernels, unless the
  machine already sets ``OPENBLAS_CORETYPE`` (some do, to avoid a faulty kernel; that is kept).

Before running the command the script checks, in a fresh interpreter, that torch and NumPy really
report the reduced kernels, and fails if they do not (a switch silently ignored would make the
second pass a copy of the first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def second_kernel_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the second kernel set, on top of ``base`` (default: ``os.environ``)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    env = dict(os.environ if base is None else base)
    env.update(
        ATEN_CPU_CAPABILITY="default",
        NPY_DISABLE_CPU_FEATURES=" ".join(__cpu_dispatch__),
        MKL_ENABLE_INSTRUCTIONS="SSE4_2",
        ONEDNN_MAX_CPU_ISA="SSE41",
    )
    env.setdefault("OPENBLAS_CORETYPE", "Prescott")
    return env


_PROBE = """
import json, numpy, torch
from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
print(json.dumps({
    "torch": torch.backends.cpu.get_cpu_capability(),
    "numpy_dispatch_in_use": [f for f in __cpu_dispatch__ if __cpu_features__.get(f)],
}))
"""


def probe(env: dict[str, str]) -> dict[str, object]:
    """What torch and NumPy report about their kernels in a fresh interpreter with ``env``."""
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python tools/second_kernels.py -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    env = second_kernel_env()
    seen = probe(env)
    if seen["torch"] != "DEFAULT" or seen["numpy_dispatch_in_use"]:
        print(f"error: the second kernel set did not take effect: {seen}", file=sys.stderr)
        return 1
    switches = ["ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES", "MKL_ENABLE_INSTRUCTIONS",
                "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE"]
    print("second kernel set: " + " ".join(f"{k}={env[k]!r}" for k in switches), flush=True)
    return subprocess.run(argv[1:], env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
