"""Task functions for tests/test_engines.py, importable by name in an
engine's worker processes (the tests put this folder on PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def double(payload: dict[str, Any]) -> dict[str, Any]:
    return {"value": payload["value"] * 2}


def lost_once(payload: dict[str, Any]) -> dict[str, Any]:
    """The first try of a task with ``marker`` loses its process (as the OOM
    killer or a dead machine would); the next one answers."""
    marker = payload.get("marker")
    if marker is not None and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os._exit(9)
    return {"value": payload["value"] * 2}


def raises(payload: dict[str, Any]) -> dict[str, Any]:
    if payload.get("bad"):
        raise ValueError(f"point {payload['value']} is bad")
    return {"value": payload["value"] * 2}
