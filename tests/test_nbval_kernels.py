"""nbval's kernels over Unix-domain sockets, retried once if they die while starting (tools/nbval_kernels.py).

The kernels are real: the current environment's ipykernel, and kernelspecs (found through
``JUPYTER_PATH``) whose program writes to stderr and exits before it ever replies, the first time
only or every time.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbval import kernel as nbval_kernel
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, RunningKernel

from tools import nbval_kernels


@pytest.fixture(autouse=True)
def _patched(monkeypatch: pytest.MonkeyPatch) -> None:
    # The repository's conftest already loads the plugin; set it explicitly so the test says so.
    monkeypatch.setattr(nbval_kernel, "start_new_kernel", nbval_kernels.start_new_kernel)


def _kernelspec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> str:
    folder = tmp_path / "jupyter" / "kernels" / name
    folder.mkdir(parents=True)
    program = folder / "kernel.py"
    program.write_text(script)
    spec = {"argv": [sys.executable, str(program), "-f", "{connection_file}"], "display_name": name,
            "language": "python"}
    (folder / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    assert name in KernelSpecManager().find_kernel_specs()
    return name


def test_a_kernel_runs_over_unix_sockets_and_its_folder_goes_with_it() -> None:
    kernel = RunningKernel(CURRENT_ENV_KERNEL_NAME, cwd=os.getcwd(), startup_timeout=60)
    outputs: list[dict] = []
    try:
        info = kernel.km.get_connection_info()
        assert info["transport"] == "ipc"
        folder = kernel.km.folder
        assert Path(info["ip"]).parent == folder
        assert len(f"{info['ip']}-{info['hb_port']}".encode()) < 108  # a Unix socket path's limit
        reply = kernel.kc.execute_interactive("print(6 * 7)", timeout=30,
                                              output_hook=outputs.append)
        assert reply["content"]["status"] == "ok"
    finally:
        kernel.stop()
    assert any(m["msg_type"] == "stream" and m["content"]["text"] == "42\n" for m in outputs)
    assert not folder.exists(), "the kernel's folder (sockets, stderr) outlives its shutdown"


def test_a_kernel_that_dies_once_is_started_again_with_a_warning_that_carries_its_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "died-once"
    name = _kernelspec(tmp_path, monkeypatch, "dies-once", f"""
import os, sys
if not os.path.exists({str(marker)!r}):
    open({str(marker)!r}, "w").close()
    sys.stderr.write("zmq.error.ZMQError: Address already in use (the first start)\\n")
    sys.exit(1)
from ipykernel.kernelapp import launch_new_instance
launch_new_instance()
""")
    with pytest.warns(nbval_kernels.KernelRestartWarning, match="Address already in use"):
        kernel = RunningKernel(name, cwd=str(tmp_path), startup_timeout=30)
    try:
        assert marker.exists()
        reply = kernel.kc.execute_interactive("1 + 1", timeout=30)
        assert reply["content"]["status"] == "ok"
    finally:
        kernel.stop()


def test_a_kernel_that_dies_twice_fails_with_both_stderr_texts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the kernels' folders go
    name = _kernelspec(tmp_path, monkeypatch, "always-dies", """
import sys
sys.stderr.write("ImportError: no module named 'broken'\\n")
sys.exit(1)
""")
    with pytest.raises(RuntimeError, match="died while starting, twice") as caught:
        RunningKernel(name, cwd=str(tmp_path), startup_timeout=30)
    assert str(caught.value).count("no module named 'broken'") == 2
    assert not list(tmp_path.glob("nbval-kernel-*")), "a dead kernel's folder was left behind"
