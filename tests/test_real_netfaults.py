"""Network faults on the real target in hosts mode.

``partition``, ``isolate_keeper`` and ``loss`` are nftables rules inside the
hosts' namespaces (real/netns.py), put in by the launcher at the fault and
taken out after ``for_s`` (a ``heal`` record, as on the sim); ``delay`` is the
host agent's relay of its workers' keeper link holding each chunk back
(real/relay.py: no netem here). Only the
effect is the launcher's: the core keeper sees heartbeats stop, evicts, and
readmits the fenced workers as newcomers once their beats arrive again.

Each test runs a small hosts scenario on real and checks: the run is valid
(the checker, per-sample ledger included), the cut-off side commits nothing
while cut off, sim and real decide the same generations (members) for it,
and nothing of the run is left (no namespace, link or process). The full
field-by-field sim/real comparison of the shipped scenarios is in
tests/test_conformance.py.

These need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and nftables; elsewhere
they skip with netns_available()'s reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from real.netns import netns_available
from rollcall.results import read_history
from rollcall.scenario import load_scenario
from real_processes import REAL_PROCESSES
from shipped_runs import Pair
from test_real_hosts import assert_nothing_left, member_ids

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
REASON = netns_available()
needs_netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")
pytestmark = [*REAL_PROCESSES, needs_netns]


def generations(history: list[dict]) -> list[tuple[int, list[int], str]]:
    return [(r["gen"], member_ids(r), r["reason"]) for r in history if r["f"] == "generation"]


def the(history: list[dict], kind: str) -> dict:
    (r,) = [r for r in history if r["f"] == "fault" and r["kind"] == kind]
    return r


def assert_valid(summary: dict[str, Any], steps: int) -> None:
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["samples_duplicated"] == 0 and summary["samples_skipped"] == 0
    assert summary["steps_committed"] == steps


def assert_cut_side_commits_nothing(history: list[dict], cut: list[int], at_step: int) -> None:
    """No step is committed on a cut-off worker's request while it is cut off
    (from the fault until the generation that readmits it), and none from
    ``at_step`` (the fault's) on in the generation the cut caught them in: the
    survivors commit again only once the keeper has formed one without them
    (the rules went in before the step's last answer, so the next step, which
    needs the cut-off members, cannot complete)."""
    fault = next(r for r in history if r["f"] == "fault" and r["kind"] != "heal")
    back = next(r for r in history if r["f"] == "generation" and r["t"] > fault["t"]
                and set(cut) <= set(member_ids(r)))
    during = [r for r in history if r["f"] == "commit" and fault["t"] < r["t"] < back["t"]]
    assert during, "the survivors committed nothing during the cut"
    assert not [r for r in during if r["process"] in cut], during
    cut_gen = max(r["gen"] for r in history if r["f"] == "generation" and r["t"] <= fault["t"])
    late = [r for r in history if r["f"] == "commit" and r["gen"] == cut_gen and r["last"] >= at_step]
    assert not late, late


@pytest.mark.timeout(300)
def test_a_partitioned_host_is_fenced_and_comes_back_as_newcomers(shipped_runs: Callable[..., Pair]) -> None:
    pair = shipped_runs("real-partition")  # the conformance test's runs too
    sc, sim, real, summary = pair.scenario, pair.sim, pair.real, pair.real_summary()
    assert_valid(summary, sc.workload.steps)
    for history in (sim, real):
        cut = the(history, "partition")
        assert cut["hosts"] == [1] and cut["workers"] == [2, 3] and cut["for_s"] == 2.5, cut
        heal = the(history, "heal")
        assert heal["hosts"] == [1] and heal["workers"] == [2, 3], heal
        assert heal["t"] - cut["t"] >= 2.5 - 1e-6
        assert sorted((r["worker"], r["reason"]) for r in history
                      if r["f"] == "evict") == [(2, "timeout"), (3, "timeout")]
        assert_cut_side_commits_nothing(history, [2, 3], sc.failures.schedule[0].when)
    assert the(real, "heal")["dropped_packets"] > 0  # the rules did cut
    assert generations(sim) == generations(real) == [
        (1, [0, 1, 2, 3], "start"), (2, [0, 1], "failure"), (3, [0, 1, 2, 3], "growth")]
    # the partition cut the survivors' step in flight on both targets at the same place
    gen2 = [next(r["cursor"] for r in h if r["f"] == "generation" and r["gen"] == 2) for h in (sim, real)]
    assert gen2[0] == gen2[1], gen2
    assert_nothing_left(pair.directory / "real", summary)


@pytest.mark.timeout(300)
def test_a_host_isolated_from_the_keeper_is_evicted_though_its_peers_reach_it(shipped_runs: Callable[..., Pair]) -> None:
    """The gray failure: host 1's heartbeats stop (the keeper's address is cut
    off) while gloo between the hosts still works; the detector evicts both its
    workers and they come back as newcomers after the heal."""
    pair = shipped_runs("real-isolate-keeper")  # the conformance test's runs too
    sc, sim, real, summary = pair.scenario, pair.sim, pair.real, pair.real_summary()
    assert_valid(summary, sc.workload.steps)
    for history in (sim, real):
        cut = the(history, "isolate_keeper")
        assert cut["host"] == 1 and cut["workers"] == [2, 3], cut
        assert the(history, "heal")["workers"] == [2, 3]
        assert sorted((r["worker"], r["reason"]) for r in history
                      if r["f"] == "evict") == [(2, "timeout"), (3, "timeout")]
        assert_cut_side_commits_nothing_isolated(history, [2, 3])
    assert the(real, "heal")["dropped_packets"] > 0  # the rules did cut
    assert generations(sim) == generations(real) == [
        (1, [0, 1, 2, 3], "start"), (2, [0, 1], "failure"), (3, [0, 1, 2, 3], "growth")]
    assert_nothing_left(pair.directory / "real", summary)


def assert_cut_side_commits_nothing_isolated(history: list[dict], cut: list[int]) -> None:
    """Isolated from the keeper, a worker's commit requests never reach it: no
    step is committed on its request until it is readmitted (its peers may
    commit the steps it helped compute: that is the gray failure)."""
    fault = the(history, "isolate_keeper")
    back = next(r for r in history if r["f"] == "generation" and r["t"] > fault["t"]
                and set(cut) <= set(member_ids(r)))
    during = [r for r in history if r["f"] == "commit" and fault["t"] + 1e-6 < r["t"] < back["t"]]
    assert during and not [r for r in during if r["process"] in cut], during


@pytest.mark.timeout(300)
def test_a_lossy_link_slows_its_host_and_the_run_stays_valid(shipped_runs: Callable[..., Pair]) -> None:
    """``loss``: a fraction of host 1's packets dropped (both directions) for
    ``for_s``; every transport is TCP, so a drop is a retransmission, never a
    lost message: the run completes valid with the fault and heal records as
    the sim writes them, and no generation changes on either target (the
    scenario's timeout is above the longest silence a 1 s loss can cause)."""
    pair = shipped_runs("real-loss-host")  # the conformance test's runs too
    sc, sim, real, summary = pair.scenario, pair.sim, pair.real, pair.real_summary()
    assert_valid(summary, sc.workload.steps)
    for history in (sim, real):
        cut = the(history, "loss")
        assert cut["host"] == 1 and cut["workers"] == [2, 3] and cut["rate"] == 0.3, cut
        heal = the(history, "heal")
        assert heal["hosts"] == [1] and heal["t"] - cut["t"] >= cut["for_s"] - 1e-6
    # the rules did drop (their counters), and TCP carried every message through:
    # nobody was evicted, the generation never changed
    assert the(real, "heal")["dropped_packets"] > 0
    assert generations(sim) == generations(real) == [(1, [0, 1, 2, 3], "start")]
    assert not [r for r in real if r["f"] == "evict"]
    assert_nothing_left(pair.directory / "real", summary)


@pytest.mark.timeout(300)
def test_a_delayed_keeper_link_evicts_its_host_and_it_comes_back(shipped_runs: Callable[..., Pair]) -> None:
    """``delay``: host 1's keeper link (its agent's relay, real/relay.py: this
    kernel has no netem) holds every chunk back 2.5 s for 2 s, past the 1 s
    detector timeout: the keeper evicts both its workers for their silence,
    host 0 goes on, and when the late beats arrive the two learn they were
    evicted and come back as newcomers, on both targets. The gloo exchange
    is not delayed on real (the sim's is), so the survivors' generation may
    resume a step later on real: the members agree, not the cursor."""
    pair = shipped_runs("real-delay-host")  # the conformance test's runs too
    sc, sim, real, summary = pair.scenario, pair.sim, pair.real, pair.real_summary()
    assert_valid(summary, sc.workload.steps)
    for history in (sim, real):
        cut = the(history, "delay")
        assert cut["host"] == 1 and cut["workers"] == [2, 3] and cut["latency_s"] == 2.5, cut
        heal = the(history, "heal")
        assert heal["hosts"] == [1] and heal["t"] - cut["t"] >= cut["for_s"] - 1e-6
        evicted = [r for r in history if r["f"] == "evict"]
        assert sorted((r["worker"], r["reason"]) for r in evicted) == [(2, "timeout"), (3, "timeout")]
        # no earlier than the timeout after the delay began: a delay, not a cut
        assert all(r["t"] - cut["t"] >= sc.detector.timeout_s - 0.1 for r in evicted), evicted
    assert generations(sim) == generations(real) == [
        (1, [0, 1, 2, 3], "start"), (2, [0, 1], "failure"), (3, [0, 1, 2, 3], "growth")]
    assert_nothing_left(pair.directory / "real", summary)


@pytest.mark.timeout(300)
def test_a_run_that_ends_while_a_delayed_backlog_is_held_still_hears_it(tmp_path: Path) -> None:
    """Host 1's keeper link is held back 3 s from step 5 to the end, under a
    6 s detector timeout: nobody is evicted, and the last step waits for host
    1's commit answer (6 s there and back; gloo is not delayed). That step
    commits on host 0's vote while host 1's ledger records of it are still
    held in its relay, longer than the launcher waits for the members' final
    reports (2 s). The launcher drains every worker's link to its end before
    it stops anything (``Launcher.drain``): without that, those records are
    lost and the ledger finds the last step's samples missing."""
    from real import driver as real_driver

    sc = load_scenario(SCENARIOS / "real-lose-host.yaml", [
        "failures.schedule=[{at_step: 5, delay: 1, latency_s: 3.0, for_s: 60.0}]",
        "workload.steps=7", "detector.timeout_s=6.0"])
    summary = real_driver.run(sc, tmp_path)
    assert_valid(summary, 7)
    history = list(read_history(tmp_path))
    cut, end = the(history, "delay"), history[-1]
    assert end["f"] == "end" and not [r for r in history if r["f"] in ("drain", "evict", "heal")]
    last = [r["process"] for r in history if r["f"] == "contribute" and r["step"] == 6]
    assert sorted(last) == [0, 1, 2, 3], last
    # host 1's were held: the run ended a latency after they left
    assert end["t"] >= max(r["t"] for r in history if r["f"] == "contribute") + cut["latency_s"]
    assert_nothing_left(tmp_path, summary)
