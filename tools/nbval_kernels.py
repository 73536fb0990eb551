"""nbval's kernels started without a race for TCP ports, their stderr kept (a pytest plugin).

Loaded by the repository's ``conftest.py``. nbval (0.11) starts each notebook's kernel through
jupyter_client over TCP: the client binds five sockets to port 0, closes them and hands their numbers
to the kernel, which binds them again a second or so later, once Python has started. Any process on
the machine that binds or connects in that window can be given one of those ports, and the kernel then
exits at once; nbval reports every cell of the notebook as "Kernel died before replying to
kernel_info", and the kernel's own message is lost, since nbval sends its stderr to ``/dev/null``.
``make test`` runs two notebooks at a time beside gloo process groups and a TRL run, all opening
sockets, and met this once (a fresh-clone CI run, all 52 cells of §12).

Here every kernel nbval starts talks to it over Unix-domain sockets (jupyter_client's ``ipc``
transport) in a private temporary folder, which no other process is handed; its stderr is written to
a file in that folder. A kernel that still dies while starting is started once more, and the run's
summary lists it with what the dead kernel wrote to stderr (``nbval kernels``), so a retry is never
silent; if the second start fails too, the error carries both stderr texts. The folder is removed
when the kernel is shut down.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager
from nbval import kernel as nbval_kernel


class KernelRestartWarning(UserWarning):
    """A notebook's kernel died while starting and was started again."""


class _IpcKernelManager(KernelManager):
    """A KernelManager whose sockets and stderr file live in its own temporary folder."""

    def __init__(self, **kwargs: Any) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="nbval-kernel-"))
        # A short path: a Unix socket's path must fit in 107 bytes.
        super().__init__(transport="ipc", ip=str(self.folder / "k"), **kwargs)
        self.stderr_path = self.folder / "stderr.txt"

    def stderr_text(self, limit: int = 4000) -> str:
        try:
            text = self.stderr_path.read_text(encoding="utf8", errors="replace")
        except OSError:
            return "(no stderr file)"
        return text[-limit:] if text.strip() else "(nothing on stderr)"

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        # What shutdown_kernel awaits (the public cleanup_resources is its synchronous wrapper).
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self.folder, ignore_errors=True)


def _start_once(startup_timeout: float, kernel_name: str, kwargs: dict[str, Any]):
    km = _IpcKernelManager(kernel_name=kernel_name,
                           kernel_spec_manager=nbval_kernel.NbvalKernelspecManager())
    stderr = open(km.stderr_path, "w", encoding="utf8")  # noqa: SIM115 (the kernel owns it)
    try:
        km.start_kernel(**{**kwargs, "stderr": stderr})
    finally:
        stderr.close()  # the kernel process holds its own copy of the descriptor
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=startup_timeout)
    except RuntimeError as error:
        text = km.stderr_text()
        kc.stop_channels()
        try:
            km.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 (a dead kernel's shutdown may fail; its error is what counts)
            km.cleanup_resources()
        return None, None, f"{error}; the kernel's stderr:\n{text}"
    return km, kc, ""


def start_new_kernel(startup_timeout: float = 60, kernel_name: str = "python", **kwargs: Any):
    """nbval's ``start_new_kernel`` over ``ipc``, started a second time if the first dies."""
    devnull = kwargs.pop("stderr", None)  # nbval's /dev/null: the kernel's folder holds a file instead
    if devnull is not None:
        devnull.close()
    km, kc, first = _start_once(startup_timeout, kernel_name, kwargs)
    if km is not None:
        return km, kc
    km, kc, second = _start_once(startup_timeout, kernel_name, kwargs)
    if km is None:
        raise RuntimeError(f"the kernel died while starting, twice.\nFirst: {first}\nSecond: {second}")
    warnings.warn(KernelRestartWarning(
        f"a kernel (cwd {kwargs.get('cwd')}) died while starting and was started again: {first}"),
        stacklevel=2)
    return km, kc


def pytest_configure(config: pytest.Config) -> None:
    nbval_kernel.start_new_kernel = start_new_kernel

