"""docs/results.md defines every summary key and every history record type.

The keys: both targets' (``SUMMARY_KEYS`` and each target's own, which the
drivers assert are all a summary carries). The record types: every ``f``
a ``rec(...)`` call in the core or a driver writes, and every one a few sim
runs really wrote (so a record made another way is caught too).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollcall.results import (
    BOTH_EXTRA_KEYS, REAL_ONLY_KEYS, SIM_ONLY_KEYS, SUMMARY_KEYS, read_history,
)
from rollcall.scenario import load_scenario
from sim import driver as sim_driver

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "results.md").read_text()


def _documented(section: str) -> set[str]:
    """The backquoted names in the first column of the tables under ``section``."""
    body = DOC.split(section, 1)[1]
    names: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    return names


def test_every_summary_key_is_documented() -> None:
    keys = set(SUMMARY_KEYS) | set(BOTH_EXTRA_KEYS) | set(SIM_ONLY_KEYS) | set(REAL_ONLY_KEYS)
    missing = keys - _documented("## Summary keys")
    assert not missing, f"docs/results.md lacks summary keys {sorted(missing)}"


def _written_kinds() -> set[str]:
    found: set[str] = set()
    for folder in ("rollcall/core", "sim", "real"):
        for path in (ROOT / folder).glob("*.py"):
            found.update(re.findall(r'rec\([^,()]+, "(?:invoke|ok|fail|info)", "([a-z_]+)"',
                                    path.read_text()))
    return found


def test_every_record_type_a_driver_or_the_core_writes_is_documented() -> None:
    kinds = _written_kinds()
    assert {"generation", "evict", "commit", "contribute", "fault", "end", "exit"} <= kinds
    missing = kinds - _documented("## History records")
    assert not missing, f"docs/results.md lacks record types {sorted(missing)}"


@pytest.mark.parametrize("name,strategy", [("kill-pause-join", "elastic"),
                                           ("kill-pause-join", "checkpoint-restart"),
                                           ("sharded-small", "elastic")])
def test_every_record_type_a_sim_run_writes_is_documented(tmp_path: Path, name: str,
                                                          strategy: str) -> None:
    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml", ["target=sim"], strategy=strategy)
    summary = sim_driver.run(sc, tmp_path)
    kinds = {r["f"] for r in read_history(tmp_path)}
    missing = kinds - _documented("## History records")
    assert not missing, f"docs/results.md lacks record types {sorted(missing)}"
    assert not set(summary) - _documented("## Summary keys")
