"""Write a copy of the Jupyter Book config with a different notebook execution mode.

``make test`` verifies the stored notebook outputs with nbval and then builds the
book from those same stored outputs, without executing anything again. Jupyter
Book 1.x has no command-line switch for the execution mode, but ``jupyter-book
build --config PATH`` accepts another config file, so this script derives one
from ``_config.yml`` instead of keeping a second hand-written copy in sync.

Usage::

    python tools/book_config.py --execute off _config.yml _build/_config.verify.yml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

MODES = ("off", "auto", "force", "cache", "inline")


def derive_config(source: Path, target: Path, execute: str) -> dict:
    """Copy the YAML config at ``source`` to ``target`` with ``execute_notebooks`` set."""
    if execute not in MODES:
        raise ValueError(f"execute must be one of {MODES}, got {execute!r}")
    config = yaml.safe_load(source.read_text(encoding="utf8")) or {}
    # Quoted on purpose: YAML reads a bare `off` as the boolean False.
    config.setdefault("execute", {})["execute_notebooks"] = execute
    # Jupyter Book resolves local extension paths against the config file's folder.
    local = (config.get("sphinx") or {}).get("local_extensions") or {}
    for name, path in local.items():
        local[name] = str((source.parent / path).resolve())
    target.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Generated from {source} by tools/book_config.py; do not edit.\n"
    target.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf8")
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the book's _config.yml")
    parser.add_argument("target", type=Path, help="where to write the derived config")
    parser.add_argument("--execute", default="off", choices=MODES,
                        help="value of execute.execute_notebooks (default: off)")
    args = parser.parse_args(argv)
    derive_config(args.source, args.target, args.execute)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
