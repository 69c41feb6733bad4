"""Conformance with direct worker links: the shipped real scenarios
again, with their record in etcd and each worker finding the keeper there
itself (``keeper.store: etcd``, one standby, ``keeper.worker_links:
direct``). The launcher then carries none of the workers' messages or
commits: the keeper answers them, holds a batch's Joins and the last ack
of a step a scripted fault waits for. The decisions must still be the
sim's, under :mod:`test_conformance`'s rules.

Left out: the scenarios with link faults (not built with direct links: the
scenario is refused in one line) and those whose record is in etcd already
(they run in :mod:`test_conformance`). The slow suite runs three that take
each part the keeper carries for the workers (``EVERY_RUN``: a step's last
ack held for a kill, a relaunched batch's Joins, a newcomer's); the whole
sweep, minutes more, is the soak suite's (``make soak``).
"""

from __future__ import annotations

from typing import Callable

import pytest

from rollcall.scenario import LINK_ACTIONS, load_scenario
from test_conformance import SHIPPED, assert_same_decisions
from real_processes import REAL_PROCESSES
from shipped_runs import Pair, scenario_path

pytestmark = [*REAL_PROCESSES, pytest.mark.slow]

DIRECT = ("keeper.store=etcd", "keeper.standbys=1", "keeper.worker_links=direct")


def _direct_ok(name: str) -> bool:
    sc = load_scenario(scenario_path(name), [])
    return sc.keeper.store == "memory" and not any(
        f.action in LINK_ACTIONS for f in sc.failures.schedule)


CASES = [n for n in SHIPPED if _direct_ok(n)]
EVERY_RUN = ("real-kill-one", "real-checkpoint-restart", "real-join-one")


def test_the_sweep_covers_every_scenario_it_can() -> None:
    assert len(CASES) == 16, CASES
    assert set(EVERY_RUN) <= set(CASES), EVERY_RUN


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", [n if n in EVERY_RUN else pytest.param(n, marks=pytest.mark.soak)
                                  for n in CASES])
def test_direct_links_make_the_sims_decisions(shipped_runs: Callable[..., Pair],
                                              name: str) -> None:
    assert_same_decisions(shipped_runs(name, *DIRECT))
