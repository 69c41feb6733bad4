"""Sharded optimizer state on the real target: ZeRO-1 with buddies.

Four gloo workers keep the SGD momentum in four slices, each on two workers
(``state.replicas: 2``), and gather the parameters every step
(``real/zero.py``). A slice a worker does not hold is NaN there, so a slice
that was not really restored poisons the weights. In exact mode the final
weights do not depend on membership, so both fault cases must end with the
same bits as a replicated run that lost nobody:

- worker 1 dies: the two slices it held are copied from their other
  holders, no step is lost;
- a whole rack (workers 0 and 1, racks of two) dies: the keeper spread each
  slice's two holders over both racks, so buddies in rack 1 send the slices,
  no step is lost;
- without racks, workers 0 and 1 die together and they are both holders of
  two slices: the keeper falls back on the checkpoint of step 20, five
  steps are lost and redone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rollcall.core.placement import initial_placement
from rollcall.results import read_history
from rollcall.scenario import parse_scenario

from test_exact import scenario
from real_processes import REAL_PROCESSES

pytestmark = REAL_PROCESSES


def sharded(name: str, schedule: list[dict], rack_size: int | None = None):
    raw = scenario("four", "exact").to_dict()
    raw["name"] = name
    raw["state"] = {"sharding": "sharded", "replicas": 2}
    raw["strategy"]["checkpoint_interval_steps"] = 10
    raw["cluster"]["rack_size"] = rack_size
    raw["failures"]["schedule"] = schedule
    return parse_scenario(yaml.safe_dump(raw), f"<{name}>")


def run(sc, out: Path) -> tuple[dict, list[dict]]:
    from real import driver

    s = driver.run(sc, out)
    assert s["completed"] is True, s["end_reason"]
    assert s["valid"] is True, s["violations"]
    assert s["samples_duplicated"] == s["samples_skipped"] == 0
    assert s["steps_committed"] == sc.workload.steps
    assert s["final_weights_agree"]
    return s, [r for r in read_history(out) if r["f"] == "recovery"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    from real import driver

    s = driver.run(scenario("four", "exact"), tmp_path_factory.mktemp("replicated"))
    assert s["completed"] is True
    return s["final_weights_sha256"]


@pytest.mark.timeout(300)
def test_one_lost_worker_is_restored_from_its_buddies_with_no_lost_step(
        reference: str, tmp_path: Path) -> None:
    s, recovery = run(sharded("sharded-one", [{"at_step": 15, "kill": 1}]), tmp_path)
    after = recovery[-1]
    placement = initial_placement(4, range(4), 2)
    held = [sh for sh in range(4) if 1 in placement.holders(sh)]
    assert after["fallback"] is False and after["lost"] == []
    assert after["copies"] == len(held)  # one new replica per slice worker 1 held
    assert s["fallbacks"] == 0 and s["steps_lost_to_fallback"] == 0
    assert s["final_weights_sha256"] == reference


@pytest.mark.timeout(300)
def test_a_lost_rack_is_restored_from_buddies_with_no_lost_step(reference: str, tmp_path: Path) -> None:
    s, recovery = run(sharded("sharded-rack", [{"at_step": 15, "kill_rack": 0}], rack_size=2),
                      tmp_path)
    (fault,) = [r for r in read_history(tmp_path) if r["f"] == "fault"]
    assert fault["kind"] == "kill_rack" and sorted(fault["workers"]) == [0, 1]
    first, after = recovery
    assert first["initial"] is True
    assert after["fallback"] is False and after["lost"] == []
    assert after["copies"] == 4  # every slice lost one of its two holders
    assert s["fallbacks"] == 0 and s["steps_lost_to_fallback"] == 0
    assert s["final_weights_sha256"] == reference


@pytest.mark.timeout(300)
def test_losing_every_holder_of_a_slice_falls_back_on_the_checkpoint(
        reference: str, tmp_path: Path) -> None:
    placement = initial_placement(4, range(4), 2)
    both = [s for s in range(4) if set(placement.holders(s)) <= {0, 1}]
    assert both, "the premise: some slice lives only on workers 0 and 1"
    s, recovery = run(sharded("sharded-pair", [{"at_step": 25, "kill": [0, 1]}]), tmp_path)
    after = recovery[-1]
    assert after["fallback"] is True
    assert [s_ for lo, hi in after["lost"] for s_ in range(lo, hi + 1)] == both
    assert s["fallbacks"] == 1 and s["steps_lost_to_fallback"] == 5  # back to step 20
    assert s["final_weights_sha256"] == reference
