"""The sim's per-host links (sim/network.py) and the ``delay`` and ``loss`` faults.

The link model's arithmetic (latency added, TCP retransmissions after an
RTO that doubles, reproducible draws, cuts), the schema's one-line errors,
and whole runs: the shipped scenarios valid and deterministic, a delay
below the detector timeout evicting nobody but lengthening steps, one above
it evicting the host's workers, who come back, loss slowing a valid run,
and any schedule of delays and losses giving a valid history.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rollcall.core.history import members_of
from rollcall.app.plan import plan
from rollcall.scenario import ScenarioError, load_scenario
from sim.driver import Simulation, run
from sim.network import RETRIES_MAX, RTO_MAX_S, RTO_MIN_S, Links

ROOT = Path(__file__).resolve().parent.parent
DELAY = ROOT / "scenarios" / "delay-host.yaml"
LOSS = ROOT / "scenarios" / "loss-host.yaml"
PARTITION = ROOT / "scenarios" / "partition-host.yaml"


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def _with(schedule: str, *more: str) -> object:
    """partition-host's cluster (8 workers, hosts of 2, timeout 3 s) with ``schedule``."""
    return load_scenario(PARTITION, [f"failures.schedule={schedule}", *more])


# -- the link model -----------------------------------------------------------

def test_a_healthy_link_costs_the_scenario_latency_and_a_delay_adds_to_it() -> None:
    links = Links(seed=0, latency_s=0.001)
    assert not links.degraded and links.one_way_s(3, "m") == 0.001
    links.degrade(3, extra_s=0.5)
    links.degrade(3, extra_s=0.25)  # two delays on one link stack
    assert links.degraded and links.degraded_hosts() == [3]
    assert links.one_way_s(3, "m") == pytest.approx(0.751)
    assert links.one_way_s(2, "m") == 0.001 and links.one_way_s(None, "m") == 0.001
    assert links.exchange_extra_s([2, 3]) == pytest.approx(0.75)
    assert links.exchange_extra_s([2]) == 0.0
    links.restore(3, extra_s=0.5)
    assert links.extra_s(3) == pytest.approx(0.25)
    links.restore(3, extra_s=0.25)
    assert not links.degraded and links.one_way_s(3, "m") == 0.001


def test_retransmissions_follow_the_rto_doubling_and_are_reproducible() -> None:
    """Every wait is a sum of RTO, 2 RTO, 4 RTO, ... (RTO = RTT + 200 ms): the
    number of drops, drawn per transmission from the seed's named stream."""
    a, b, c = Links(7, 0.001), Links(7, 0.001), Links(8, 0.001)
    for links in (a, b, c):
        links.degrade(1, rate=0.3)
    rto = a.rto_s(1)
    assert rto == pytest.approx(2 * 0.001 + RTO_MIN_S)
    waits = [a.retransmit_s(1, "beat/2") for _ in range(2000)]
    assert waits == [b.retransmit_s(1, "beat/2") for _ in range(2000)]  # same seed, same draws
    assert waits != [c.retransmit_s(1, "beat/2") for _ in range(2000)]  # another seed
    series = [rto * (2 ** n - 1) for n in range(6)]  # n drops in a row
    assert all(any(w == pytest.approx(s) for s in series) or w > series[-1] for w in waits)
    dropped = sum(w > 0 for w in waits) / len(waits)
    assert 0.2 < dropped < 0.4  # P(first transmission dropped) = 0.3
    twice = sum(w > rto * 1.5 for w in waits) / len(waits)
    assert 0.04 < twice < 0.15  # P(two in a row) = 0.09


def test_a_stream_draws_the_same_whatever_other_streams_are_asked() -> None:
    a, b = Links(3, 0.0), Links(3, 0.0)
    for links in (a, b):
        links.degrade(0, rate=0.5)
    first = [a.retransmit_s(0, "msg/1") for _ in range(50)]
    for _ in range(50):
        b.retransmit_s(0, "msg/9")  # another connection's traffic in between
    assert first == [b.retransmit_s(0, "msg/1") for _ in range(50)]


def test_retransmissions_stop_at_tcp_retries2_with_the_rto_capped() -> None:
    links = Links(0, 0.0)
    links.degrade(0, rate=1 - 1e-15)  # every transmission dropped
    rto, total = RTO_MIN_S, 0.0
    for _ in range(RETRIES_MAX):
        total += rto
        rto = min(2 * rto, RTO_MAX_S)
    assert links.retransmit_s(0, "x") == pytest.approx(total)


def test_a_lossless_link_draws_nothing() -> None:
    links = Links(0, 0.001)
    links.degrade(0, extra_s=1.0)
    assert links.retransmit_s(0, "x") == 0.0 and links.one_way_s(0, "x") == pytest.approx(1.001)
    assert links._k == {}


def test_a_partition_blocks_keeper_and_peers_an_isolation_only_the_keeper() -> None:
    links = Links(0, 0.001)
    links.cut([1, 2], "partition")
    links.cut([3], "isolate_keeper")
    assert not links.reaches_keeper(1) and not links.reaches_peers(2)
    assert not links.reaches_keeper(3) and links.reaches_peers(3)
    assert links.reaches_keeper(0) and links.reaches_peers(0)
    links.heal([1, 2, 3])
    assert all(links.reaches_keeper(h) and links.reaches_peers(h) for h in range(4))


@pytest.mark.parametrize("extra_s, evicted", [(2.0, False), (2.4, False), (2.6, True), (4.0, True)])
def test_a_delay_silences_the_beats_once_and_only_past_the_timeout(extra_s: float,
                                                                   evicted: bool) -> None:
    """Beats every 0.5 s; from 10 s each pays ``extra_s`` more: the keeper sees one
    gap of 0.5 s + extra_s, a silence past a 3 s timeout only if that is longer."""
    links = Links(0, 0.001)
    links.degrade(1, extra_s=extra_s)
    gaps = links.beat_gaps(2, 1, 0.0, 0.5, 10.0, 16.0, 3.0)
    if not evicted:
        assert gaps == []
        return
    (last, arrival), = gaps
    assert last == pytest.approx(9.5 + 0.001) and arrival == pytest.approx(10.0 + 0.001 + extra_s)


def test_beats_held_back_by_a_retransmission_arrive_in_order() -> None:
    links = Links(1, 0.001)
    links.degrade(0, rate=0.6)
    gaps = links.beat_gaps(0, 0, 0.25, 0.5, 0.0, 200.0, 3.0)
    assert gaps, "at 60% loss some beat waits out four RTOs in 200 s"
    assert all(b - a > 3.0 for a, b in gaps)
    assert all(a1 <= a2 for (_, a1), (a2, _) in zip(gaps, gaps[1:]))


# -- the schema ---------------------------------------------------------------

@pytest.mark.parametrize("fault, where, words", [
    ("{at_s: 1.0, delay: 4, latency_s: 0.5, for_s: 2.0}", "delay", "host 4 does not exist"),
    ("{at_s: 1.0, loss: 1, rate: 1.0, for_s: 2.0}", "rate", "must be < 1"),
    ("{at_s: 1.0, loss: 1, rate: -0.1, for_s: 2.0}", "rate", ">= 0"),
    ("{at_s: 1.0, delay: 1, latency_s: 3600.5, for_s: 2.0}", "latency_s", "must be <= 3600"),
    ("{at_s: 1.0, delay: 1, latency_s: 0.5}", "for_s", "required with delay"),
    ("{at_s: 1.0, loss: 1, rate: 0.1}", "for_s", "required with loss"),
    ("{at_s: 1.0, delay: 1, for_s: 2.0}", "latency_s", "required with delay"),
    ("{at_s: 1.0, loss: 1, for_s: 2.0}", "rate", "required with loss"),
    ("{at_s: 1.0, loss: 1, rate: 0.1, latency_s: 1.0, for_s: 2.0}", "latency_s",
     "only allowed with delay"),
    ("{at_s: 1.0, kill: 1, rate: 0.1}", "rate", "only allowed with loss"),
])
def test_bad_link_faults_get_one_line_errors(fault: str, where: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(PARTITION, [f"failures.schedule=[{fault}]", "cluster.workers=6",
                                  "rendezvous.min_workers=3"])
    text = str(err.value)
    assert f"failures.schedule.0.{where}" in text and words in text, text


def test_link_faults_need_hosts() -> None:
    with pytest.raises(ScenarioError, match="needs cluster.workers_per_host"):
        load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                      ["failures.schedule=[{at_s: 1.0, delay: 0, latency_s: 0.5, for_s: 2.0}]"])


def test_link_faults_take_a_random_host_as_lose_host_does(tmp_path: Path) -> None:
    sc = _with("[{at_s: 2.0, delay: random, latency_s: 0.2, for_s: 2.0}]")
    assert sc.failures.schedule[0].link == "random" and sc.failures.schedule[0].count == 1
    summary = run(sc, tmp_path)
    (fault,) = [r for r in _records(tmp_path) if r["f"] == "fault" and r["kind"] == "delay"]
    assert 0 <= fault["host"] < 4 and fault["workers"] == [2 * fault["host"], 2 * fault["host"] + 1]
    assert summary["valid"] and summary["completed"], summary["violations"]


# -- runs ---------------------------------------------------------------------

@pytest.mark.parametrize("path", [DELAY, LOSS], ids=["delay-host", "loss-host"])
@pytest.mark.parametrize("strategy", ["elastic", "checkpoint-restart"])
def test_shipped_link_scenarios_are_valid_and_deterministic(tmp_path: Path, path: Path,
                                                            strategy: str) -> None:
    sc = load_scenario(path, [f"strategy.kind={strategy}"])
    first = run(sc, tmp_path / "a")
    run(load_scenario(path, [f"strategy.kind={strategy}"]), tmp_path / "b")
    assert first["valid"] and first["completed"], first["violations"]
    assert first["samples_skipped"] == 0 and first["samples_duplicated"] == 0
    recs = _records(tmp_path / "a")
    assert any(r["f"] == "contribute" and "samples" in r for r in recs)  # the per-sample ledger
    assert (tmp_path / "a" / "history.jsonl").read_bytes() == \
        (tmp_path / "b" / "history.jsonl").read_bytes()


def test_a_delay_below_the_timeout_evicts_nobody_but_lengthens_steps(tmp_path: Path) -> None:
    base = run(_with("[]"), tmp_path / "base")
    sc = _with("[{at_s: 5.0, delay: 1, latency_s: 0.5, for_s: 5.0}]")
    slow = run(sc, tmp_path / "slow")
    recs = _records(tmp_path / "slow")
    assert slow["valid"] and slow["completed"], slow["violations"]
    assert slow["evictions"] == 0 and slow["failures"] == 0 and slow["generations"] == 1
    # each step inside the delay costs the healthy step plus the link's 0.5 s
    inside = [r for r in recs if r["f"] == "commit" and 5.5 < r["t0"] and r["t"] < 10.0]
    assert inside
    for r in inside:
        per_step = (r["t"] - sc.network.latency_s - r["t0"]) / (r["last"] - r["step"] + 1)
        assert per_step == pytest.approx(sc.ideal_step_s + 0.5, rel=1e-6)
    after = [r for r in recs if r["f"] == "commit" and r["t0"] > 10.5]
    assert all((r["t"] - sc.network.latency_s - r["t0"]) / (r["last"] - r["step"] + 1)
               == pytest.approx(sc.ideal_step_s, rel=1e-6) for r in after)
    # the job lost 0.5 s per step computed in the delay's 5 s (one of them a checkpoint write)
    computing_s = 5.0 - sc.strategy.checkpoint_write_s
    lost_s = computing_s / (sc.ideal_step_s + 0.5) * 0.5
    assert slow["elapsed_s"] - base["elapsed_s"] == pytest.approx(lost_s, rel=0.01)


def test_a_delay_past_the_timeout_evicts_the_host_and_its_workers_come_back(tmp_path: Path) -> None:
    sc = _with("[{at_s: 5.0, delay: 1, latency_s: 4.0, for_s: 6.0}]")
    summary = run(sc, tmp_path)
    recs = _records(tmp_path)
    (fault,) = [r for r in recs if r["f"] == "fault" and r["kind"] == "delay"]
    (heal,) = [r for r in recs if r["f"] == "fault" and r["kind"] == "heal"]
    assert fault["workers"] == [2, 3] and heal["t"] == pytest.approx(11.0)
    evicted = {r["worker"]: (r["reason"], r["t"]) for r in recs if r["f"] == "evict"}
    assert set(evicted) == {2, 3} and all(why == "timeout" for why, _ in evicted.values())
    # the keeper saw the last on-time beat (4.5 s + latency) and waited timeout_s
    assert all(t == pytest.approx(4.5 + sc.network.latency_s + 3.0) for _, t in evicted.values())
    gens = [r for r in recs if r["f"] == "generation"]
    assert any(members_of(g) == (0, 1, 4, 5, 6, 7) for g in gens)
    last = gens[-1]
    assert set(members_of(last)) == set(range(8)) and last["reason"] == "growth"
    assert summary["failures"] == 2 and summary["valid"] and summary["completed"]


def test_a_small_loss_rate_slows_the_job_but_the_run_stays_valid(tmp_path: Path) -> None:
    base = run(_with("[]"), tmp_path / "base")
    lossy = run(_with("[{at_s: 5.0, loss: 1, rate: 0.1, for_s: 20.0}]"), tmp_path / "lossy")
    assert lossy["valid"] and lossy["completed"], lossy["violations"]
    assert lossy["steps_committed"] == base["steps_committed"]
    assert lossy["elapsed_s"] > base["elapsed_s"] + 0.5  # some exchanges waited out an RTO


def test_a_bulk_transfer_is_held_by_a_heavy_loss_until_it_ends() -> None:
    links = Links(seed=1, latency_s=0.001)
    links.degrade(0, rate=0.3, until=1.0)
    rto = 2 * 0.001 + RTO_MIN_S
    # 111 segments (a 20k-parameter exchange): an attempt fails with 1 - 0.7^111 ~ 1,
    # so the attempts at 0, rto, 3 rto fail and the one at 7 rto (past 1.0 s) gets through
    assert links.bulk_retransmit_s(0, "exchange/0", 0.0, 111) == pytest.approx(7 * rto)
    assert links.bulk_retransmit_s(0, "exchange/0", 1.0, 111) == 0.0  # after the end
    # one segment: the old per-message chain, draw for draw
    a, b = Links(seed=1, latency_s=0.001), Links(seed=1, latency_s=0.001)
    a.degrade(0, rate=0.3)
    b.degrade(0, rate=0.3)
    assert [a.bulk_retransmit_s(0, "x", 0.0, 1) for _ in range(200)] == \
        [b.retransmit_s(0, "x") for _ in range(200)]


def test_the_step_in_flight_when_a_heavy_loss_starts_waits_it_out(tmp_path: Path) -> None:
    """As on real (``real-loss-host``: 1.49 s): the exchange is held until the
    loss ends and its backed-off retransmission fires, not cut short at the heal."""
    sc = load_scenario(LOSS, ["failures.schedule=[{at_s: 5.0, loss: 1, rate: 0.3, for_s: 1.0}]",
                              "workload.model_params=20000"])
    run(sc, tmp_path)
    commits = sorted((r for r in _records(tmp_path) if r["f"] == "commit"), key=lambda r: r["t"])
    before = [c for c in commits if c["t"] <= 5.0][-1]
    held = [c for c in commits if c["t"] > 5.0][0]
    assert held["step"] == held["last"] == before["last"] + 1, (before, held)  # one step alone
    rto = 2 * sc.network.latency_s + RTO_MIN_S
    step_s = sc.workload.micro_batch_s + sc.workload.allreduce_s  # a healthy step, at most
    assert held["t"] - 5.0 >= 7 * rto > 1.0  # three failed attempts, the fourth after the end
    assert held["t"] - 5.0 <= 7 * rto + step_s


def test_without_link_faults_the_links_are_never_consulted(tmp_path: Path) -> None:
    """The fast path: no network fault, no draw and no pricing through the links."""
    sim = Simulation(_with("[{at_s: 5.0, partition: [2], for_s: 6.0}]"), tmp_path)
    summary = sim.run()
    assert summary["valid"] and not sim.net.touched and sim.net.links._k == {}
    assert sim.net.links.reaches_keeper(2)  # the partition was recorded, then healed


_FAULT = st.fixed_dictionaries({
    "at_s": st.floats(0.0, 30.0).map(lambda x: round(x, 2)),
    "host": st.integers(0, 3),
    "for_s": st.floats(0.1, 10.0).map(lambda x: round(x, 2)),
    "kind": st.sampled_from(["delay", "loss"]),
    "size": st.floats(0.0, 0.9).map(lambda x: round(x, 3)),
})


def _yaml(f: dict) -> str:
    what = (f"delay: {f['host']}, latency_s: {max(f['size'] * 6, 0.01)}" if f["kind"] == "delay"
            else f"loss: {f['host']}, rate: {f['size']}")
    return f"{{at_s: {f['at_s']}, {what}, for_s: {f['for_s']}}}"


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(faults=st.lists(_FAULT, min_size=1, max_size=3),
       strategy=st.sampled_from(["elastic", "checkpoint-restart"]), seed=st.integers(0, 3))
def test_any_schedule_of_delays_and_losses_gives_a_valid_history(tmp_path: Path, faults: list,
                                                                 strategy: str, seed: int) -> None:
    schedule = "[" + ", ".join(_yaml(f) for f in faults) + "]"
    sc = _with(schedule, f"strategy.kind={strategy}", f"seed={seed}", "workload.steps=150")
    summary = run(sc, tmp_path / "h")
    assert summary["valid"], (schedule, summary["violations"])
    assert summary["completed"], (schedule, summary["end_reason"])
    assert summary["samples_skipped"] == 0 and summary["samples_duplicated"] == 0


def test_the_plan_lists_a_link_fault_with_its_host_workers_and_size() -> None:
    timeline = plan(load_scenario(DELAY))["timeline"]
    assert [(f["action"], f["host"], f["workers"], f["for_s"], f["latency_s"]) for f in timeline] \
        == [("delay", 1, [2, 3], 5.0, 0.5), ("delay", 2, [4, 5], 6.0, 4.0)]
    (loss,) = plan(load_scenario(LOSS))["timeline"]
    assert (loss["action"], loss["host"], loss["rate"]) == ("loss", 1, 0.1)
