"""Scenarios nobody here wrote, on the sim: drawn over the whole schema
(``tests/scenario_fuzz.py``), each run must end cleanly, with a valid
history, metrics in range, and the same history from the same seed.

The fast profile runs here; ``benchmarks/fuzz_sim.py`` runs 10^4 and more.
A failure names the session's seed and the command that replays the search,
and saves the shrunk scenario under ``runs/fuzz-failures/`` with the
``rollcall run`` line that replays it alone.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
from pathlib import Path
from typing import Iterator

import pytest
import simpy
from hypothesis import HealthCheck, Phase, given, seed, settings

import scenario_fuzz as fuzz
from rollcall.config import horizon_s
from rollcall.scenario import load_scenario
from sim.driver import Simulation

fuzz.import_project_modules()  # the same constants pool alone as in the whole suite

SEED_ENV = "ROLLCALL_FUZZ_SEED"
# One seed per test run (tests/conftest.py chooses it and prints it in the
# run's header), so that a failure can be replayed from it.
SEED = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))
# Runs of the fast profile: 500 (10 to 15 s here, quiet), twice the
# profile's examples where that is more (the `ci` profile: 1000).
RUN_EXAMPLES = max(500, 2 * settings.default.max_examples)
# One run in TWICE_EVERY is made twice and the histories compared: a history
# is a function of the scenario and seed alone, so a source of difference
# (a global random state, a cache kept between runs, set order) shows in
# whatever run touches it; a quarter of the runs find it at a quarter of the
# cost. Runs of more than TWICE_UP_TO workers are made once: they take
# seconds (the checkers' work grows with members x generations) and are the
# fast profile's tail. The corpus below runs every file twice; the
# benchmark, every other run whatever its size.
TWICE_EVERY = 4
TWICE_UP_TO = 1000
# Drawn without running for the coverage test, whose rarest feature comes in
# about 1% of scenarios. One hypothesis run's draws are not independent (it
# mutates earlier ones), so one run of 2000 from a random seed can miss such a
# feature altogether; ten runs of 200 from fixed seeds draw it 10 to 30 times
# and give the same answer on every machine for the same tree.
COVERAGE_SEEDS = range(10)
COVERAGE_EXAMPLES = 200  # per seed
CORPUS = sorted(fuzz.CORPUS_DIR.glob("*.yaml"))
# Scenarios the fuzzer once found crashing or spinning the sim, each named
# for what it exercises: they run clean, under the same event bounds.
REGRESSIONS = sorted((fuzz.CORPUS_DIR.parent / "fuzz-regressions").glob("*.yaml"))


def _replay_line(nodeid: str) -> str:
    profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    return (f"{SEED_ENV}={SEED} HYPOTHESIS_PROFILE={profile} PYTHONPATH=$PWD "
            f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider {shlex.quote(nodeid)}")


def test_fuzzed_scenarios_run_clean(request: pytest.FixtureRequest) -> None:
    """Each drawn scenario runs to a named end with a valid history."""

    @seed(SEED)
    @settings(max_examples=RUN_EXAMPLES, deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(fuzz.fuzz_cases(twice_every=TWICE_EVERY, twice_up_to=TWICE_UP_TO))
    def run(case: fuzz.FuzzCase) -> None:
        fuzz.check_case(case)

    try:
        run()
    except BaseException as exc:
        exc.add_note(f"seed {SEED}; replay: {_replay_line(request.node.nodeid)}")
        raise


def test_every_key_and_fault_family_is_drawn(request: pytest.FixtureRequest) -> None:
    """Every key of every section (walked from the pydantic models, so a key
    added there fails here until the generator draws it), every value of a
    key with a fixed set of them, every fault family with each trigger,
    faults near the start and the end, and each size tier are drawn."""
    seen: set[str] = set()

    @settings(max_examples=COVERAGE_EXAMPLES, phases=[Phase.generate], database=None,
              deadline=None)
    @given(fuzz.fuzz_cases())
    def draw(case: fuzz.FuzzCase) -> None:
        seen.update(fuzz.features(case))

    for each in COVERAGE_SEEDS:
        seed(each)(draw)()
    missing = sorted(fuzz.expected_features() - seen)
    drawn = len(COVERAGE_SEEDS) * COVERAGE_EXAMPLES
    assert not missing, (f"never drawn in {drawn} scenarios (seeds {list(COVERAGE_SEEDS)}): "
                         f"{missing}; replay: {_replay_line(request.node.nodeid)}")


def test_a_keeper_failing_through_a_long_wait_is_drawn_bounded() -> None:
    """A keeper that fails every few seconds while the job waits hours for
    a repair (a pipeline key at its default) would take the sim through
    10^5 keeper terms before the horizon: the draw raises ``keeper.mtbf_s``
    so that at most ``KEEPER_TERMS`` fit, and leaves a bounded one alone."""
    raw = {"name": "long-wait",
           "cluster": {"workers": 1, "spares": 3,
                       "repair": {"reboot_s": 1.81, "manual_fail_p": 0.865}},
           "workload": {"steps": 9, "global_batch": 2, "micro_batch": 1},
           "keeper": {"store": "etcd", "standbys": 1, "mtbf_s": 4.05}}
    scenario = fuzz.validated(fuzz.to_yaml(raw))
    horizon = horizon_s(scenario)
    assert horizon / 4.05 > fuzz.KEEPER_TERMS, horizon
    bounded = fuzz._bounded_keeper_terms(raw, scenario)
    mtbf = bounded["keeper"]["mtbf_s"]
    assert horizon / fuzz.KEEPER_TERMS < mtbf < 1.1 * horizon / fuzz.KEEPER_TERMS, mtbf
    assert {**bounded, "keeper": raw["keeper"]} == raw  # nothing else changed
    again = fuzz.validated(fuzz.to_yaml(bounded))
    assert fuzz._bounded_keeper_terms(bounded, again) is bounded


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fuzz.fuzz_cases())
def test_drawn_keeper_lives_fit_the_bound(case: fuzz.FuzzCase) -> None:
    keeper = case.scenario.keeper
    if keeper.mtbf_s is not None:
        assert horizon_s(case.scenario) / keeper.mtbf_s <= fuzz.KEEPER_TERMS, case.text


def test_exclusions_are_schema_features() -> None:
    """An exclusion names something the schema holds (a stale one is removed)."""
    assert set(fuzz.EXCLUDED) <= fuzz.schema_features()


@pytest.mark.parametrize("reason, accepted", [
    ("job failed: below min_workers=3 for join_timeout_s", True),
    ("job failed: max_restarts=2 reached (3 restarts)", True),
    ("job failed: not expected to finish: no step committed over 100 recoveries", True),
    ("stuck: no events left", False),
    ("horizon: simulated time limit reached", False),
    ("wall limit: --max-wall-s 600 reached", False),
])
def test_the_runner_names_a_bad_end(reason: str, accepted: bool) -> None:
    summary = {"completed": False, "end_reason": reason, "steps_committed": 3,
               "steps_target": 10}
    assert (fuzz.end_problems(summary) == []) == accepted


def test_the_runner_names_metrics_out_of_range() -> None:
    parts = {"productive_s": 1.0, "checkpoint_s": 0.5, "lost_work_s": 0.25, "recovery_s": 0.5,
             "stall_s": 0.25}
    good = {"goodput": 1.0, "ettr": 0.0, "kills": 0, "elapsed_s": 2.5, "valid": True, **parts}
    assert fuzz.metric_problems(good) == []
    for key, value in (("goodput", 1.01), ("ettr", -0.1), ("kills", -1),
                       ("elapsed_s", float("nan"))):
        problems = fuzz.metric_problems({**good, key: value})
        assert problems and key in problems[-1][0], (key, problems)
    problems = fuzz.metric_problems({**good, "stall_s": 0.5})
    assert [p for p, _ in problems] == ["time parts do not sum to elapsed_s"]


def test_the_event_bound_stops_a_run_spinning_at_one_instant() -> None:
    """A process that reschedules itself at the same instant forever is
    stopped by the bound on simulated events, through the sim's own loop."""
    sim = Simulation(fuzz.validated("name: spin\n"))

    def spin() -> Iterator[simpy.Event]:
        while True:
            yield sim.env.timeout(0)

    sim.env.process(spin())
    with pytest.raises(fuzz.SimulatedHang, match="spinning"):
        sim.run(fuzz.WALL_REPORT_S, fuzz.EventBound(sim))
    sim.recorder.close()


def test_the_corpus_is_there() -> None:
    assert len(CORPUS) >= 30, (f"{fuzz.CORPUS_DIR}: write it with "
                               f"benchmarks/fuzz_sim.py --write-corpus")


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_corpus_scenario_runs_clean(path: Path) -> None:
    """Each corpus scenario passes the runner's checks, histories compared."""
    outcome = fuzz.run_scenario(load_scenario(path, target="sim"), twice=True)
    assert outcome.ok, f"{outcome.describe()}\nreplay: {fuzz.replay_command(path)}"


@pytest.mark.parametrize("path", REGRESSIONS, ids=lambda p: p.stem)
def test_regression_scenario_runs_clean(path: Path) -> None:
    """Each scenario the fuzzer found breaking the sim passes the runner's
    checks (a named end, a valid history, the same history twice)."""
    outcome = fuzz.run_scenario(load_scenario(path, target="sim"), twice=True)
    assert outcome.ok, f"{outcome.describe()}\nreplay: {fuzz.replay_command(path)}"


def test_the_regressions_are_there() -> None:
    assert len(REGRESSIONS) >= 3, "tests/data/fuzz-regressions/"
