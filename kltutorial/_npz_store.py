"""One ``.npz`` file of arrays with a JSON metadata entry: how the stored runs of the book are written
(:mod:`kltutorial.studies.toy_runs`, :mod:`kltutorial.textrlhf.runs`) and how their metadata is read."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["write_npz", "read_npz_metadata"]


def write_npz(path: str | Path, arrays: Mapping[str, np.ndarray], metadata: Mapping) -> None:
    """Write ``arrays`` and ``metadata`` (as JSON, under the key ``"metadata"``) to ``path``, compressed,
    creating its folder."""
    if "metadata" in arrays:
        raise ValueError("arrays must not hold a key 'metadata': it is where the metadata goes")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        np.savez_compressed(handle, **arrays, metadata=np.array(json.dumps(metadata)))


def read_npz_metadata(path: str | Path) -> dict:
    """The metadata :func:`write_npz` stored at ``path``."""
    with np.load(path) as data:
        return json.loads(str(data["metadata"]))
