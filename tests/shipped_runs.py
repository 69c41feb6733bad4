"""Each scenario's pair of runs, sim and real, made once per test run.

Several test modules check different things of the same run of a shipped
scenario: the conformance test its decisions, the real-target and network
tests what each target promises. A real run takes seconds and only one runs
at a time (tests/conftest.py), so each pair is made once, by whichever test
asks first, and kept in the temporary root every xdist worker shares. The
caller must hold the real-process lock (carry ``REAL_PROCESSES``).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from rollcall.results import SUMMARY_KEYS, read_history, read_summary
from rollcall.scenario import Scenario, load_scenario
from real_processes import shared_tmp_root

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
REGRESSIONS = ROOT / "tests" / "data" / "scenarios"  # regression scenarios, not shipped


class Pair(NamedTuple):
    scenario: Scenario
    sim: list[dict]  # the sim's history
    real: list[dict]  # the real target's history
    directory: Path  # the runs' directories: ``sim/`` and ``real/`` in it

    def real_summary(self) -> dict:
        summary = read_summary(self.directory / "real")
        assert set(SUMMARY_KEYS) <= set(summary), sorted(set(SUMMARY_KEYS) - set(summary))
        return summary


def scenario_path(name: str) -> Path:
    """A shipped scenario's file, or a regression scenario's of the tests' own."""
    path = SCENARIOS / f"{name}.yaml"
    return path if path.exists() else REGRESSIONS / f"{name}.yaml"


_made: dict[tuple[str, ...], Pair] = {}  # this process's, read back once


def pair_of(factory: pytest.TempPathFactory, name: str, *overrides: str) -> Pair:
    """The scenario ``name`` with ``overrides`` run on each target (skipped
    where this machine cannot run it on real)."""
    from real import driver as real_driver
    from real.etcd import etcd_binary
    from real.netns import netns_available
    from sim import driver as sim_driver

    key = (name, *overrides)
    if key in _made:
        return _made[key]
    sc = load_scenario(scenario_path(name), list(overrides))
    if sc.cluster.workers_per_host is not None and (why := netns_available()) is not None:
        pytest.skip(f"{name} runs its hosts as network namespaces on real: {why}")
    if sc.keeper.store == "etcd" and etcd_binary() is None:
        pytest.skip(f"{name} keeps its record in etcd on real: no etcd binary "
                    f"(Debian's etcd-server)")
    out = _pair_dir(factory, key)
    if not (out / "done").exists():
        # the caller holds the real-process lock, so no other xdist worker
        # writes this pair meanwhile
        shutil.rmtree(out, ignore_errors=True)  # an earlier attempt's, cut short
        out.mkdir(parents=True)
        sim_driver.run(sc, out / "sim")
        real_driver.run(sc, out / "real")
        (out / "done").touch()
    _made[key] = Pair(sc, list(read_history(out / "sim")), list(read_history(out / "real")), out)
    return _made[key]


def _pair_dir(factory: pytest.TempPathFactory, key: tuple[str, ...]) -> Path:
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
    return shared_tmp_root(factory) / "shipped-pairs" / f"{key[0]}-{digest}"
