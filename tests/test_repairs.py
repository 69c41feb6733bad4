"""The repair shop (:mod:`rollcall.core.repairs`) against its closed forms.

A failure's time out of service and the chance that its repair removed the
fault have closed forms (:meth:`RepairPolicy.mean_repair_s`,
:meth:`RepairPolicy.fix_p`); the shop's seeded draws must meet them. On a
whole sim run, the nodes in repair are a finite-source M/G/inf queue: each
of N nodes is up for an exponential lifetime of mean M, then out for a
repair of mean R whatever its distribution, so at a random instant the
number in repair is Binomial(N, R / (M + R)) (the Engset model is insensitive
to the repair time's distribution), and a node's availability is
M / (M + R). The tests read the count from the history alone (``crash`` and
``repair`` fault records).
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path

import pytest

from rollcall.core import (
    Blame, Draws, FailureModel, Pull, Repair, RepairPolicy, RepairShop, Retire, Warm,
)
from rollcall.core.history import members_of
from rollcall.results import read_history
from rollcall.scenario import ScenarioError, parse_scenario
from real_processes import REAL_PROCESSES
from sim.driver import Simulation

PIPELINE = RepairPolicy(auto_s=7200.0, manual_s=86400.0, manual_p=0.5, auto_fail_p=0.4,
                        manual_fail_p=0.2, diagnosis_p=0.9, reboot_s=600.0)


def _shop(policy: RepairPolicy | None = PIPELINE, seed: int = 7, **kw) -> RepairShop:
    kw = {"up": 4, "want": 4, "target": 4, **kw}
    return RepairShop(Draws(seed, None), policy, **kw)


def test_mean_repair_time_and_fix_probability_meet_their_closed_forms() -> None:
    shop = _shop()
    n = 40_000
    out = [shop.down(0.0, w)[0] for w in range(n)]
    assert all(isinstance(r, Repair) for r in out)
    mean = sum(r.back_at_s for r in out) / n  # type: ignore[union-attr]
    expected = PIPELINE.mean_repair_s()
    assert expected == pytest.approx(0.9 * (7200.0 + 0.5 * 86400.0) + 0.1 * 600.0)
    # the service time's sd is below 2x its mean here: 4 sd of the mean of n
    assert abs(mean - expected) < 4 * 2 * expected / math.sqrt(n), (mean, expected)
    cured = sum(r.cured for r in out) / n  # type: ignore[union-attr]
    p = PIPELINE.fix_p()
    assert p == pytest.approx(0.9 * (0.5 * 0.6 + 0.5 * 0.8))
    assert abs(cured - p) < 4 * math.sqrt(p * (1 - p) / n), (cured, p)
    hows = Counter(r.how for r in out)  # type: ignore[union-attr]
    assert abs(hows["undiagnosed"] / n - 0.1) < 0.01 and abs(hows["manual"] / n - 0.45) < 0.015


def test_repairs_depend_on_seed_node_and_failure_count_only() -> None:
    a, b = _shop(), _shop()
    first = [a.down(10.0 * k, w)[0] for k in range(3) for w in (5, 9)]
    second = [b.down(10.0 * k, w)[0] for k in range(3) for w in (9, 5)]  # other order
    by = lambda rs: sorted((r.worker, r.back_at_s) for r in rs)  # noqa: E731
    assert by(first) == by(second)
    assert by(first) != by([_shop(seed=8).down(10.0 * k, w)[0] for k in range(3) for w in (5, 9)])


def test_a_cured_bad_node_lives_as_a_good_one_and_a_fixed_time_cures_nothing() -> None:
    model = FailureModel(seed=1, distribution="exponential", mean_s=1000.0, bad_fraction=1.0,
                         bad_multiplier=6.0)
    draws = Draws(1, model)
    shop = RepairShop(draws, RepairPolicy(manual_p=0.0, auto_fail_p=0.0), up=1, want=1, target=1)
    assert draws.next_lifetime(0) == pytest.approx(model.lifetime(0, 0))
    repair = shop.down(5.0, 0)[0]
    assert isinstance(repair, Repair) and repair.cured and repair.how == "auto"
    assert draws.next_lifetime(0) == pytest.approx(6.0 * model.lifetime(0, 1))
    fixed = Draws(1, model)
    RepairShop(fixed, RepairPolicy(fixed_s=60.0), up=1, want=1, target=1).down(5.0, 0)
    fixed.next_lifetime(0)
    assert fixed.next_lifetime(0) == pytest.approx(model.lifetime(0, 1))  # still bad


def _nobody_asked() -> list[int]:
    raise AssertionError("the innocents were asked for without a wrong diagnosis")


def test_a_wrong_diagnosis_sends_an_innocent_to_repair_and_the_culprit_back_as_it_was() -> None:
    policy = RepairPolicy(manual_p=0.0, auto_fail_p=0.0, wrong_blame_p=1.0, reboot_s=60.0)
    shop = _shop(policy, up=5, want=5, target=5)
    asked: list[int] = []

    def members() -> list[int]:
        asked.append(1)
        return [4, 0, 2, 1]  # the culprit among them: never blamed

    culprit, blame, innocent = shop.down(100.0, 2, members)
    assert asked == [1]
    assert culprit == Repair(2, 160.0, "misdiagnosed", False)  # a reboot, its fault intact
    assert isinstance(blame, Blame) and blame.culprit == 2 and blame.worker in (0, 1, 4)
    assert isinstance(innocent, Repair) and innocent.worker == blame.worker
    assert innocent.how == "auto" and innocent.back_at_s > 100.0
    assert blame.record(100.0)["kind"] == "blame"
    assert shop.in_service == 3  # both out of service
    shop.up(160.0, 2)
    shop.up(innocent.back_at_s, blame.worker)
    assert shop.in_service == 5
    # nobody else to blame: the culprit is blamed after all, as AIReSim does
    (alone,) = _shop(policy).down(0.0, 3, lambda: [3])
    assert alone.worker == 3 and alone.how == "auto"


def test_a_node_out_of_service_is_never_blamed_until_it_is_up_again() -> None:
    """The pool a driver hands over may still name nodes the shop holds out
    (a killed process not reaped yet, an innocent whose blame is carried out
    later): the shop leaves out every node failed or blamed and not up since,
    so both targets draw from the same innocents."""
    policy = RepairPolicy(manual_p=0.0, auto_fail_p=0.0, wrong_blame_p=1.0, reboot_s=60.0)
    shop = _shop(policy, up=5, want=5, target=5)
    everyone = lambda: [0, 1, 2, 3, 4]  # noqa: E731
    _, first, _ = shop.down(0.0, 0, everyone)
    assert isinstance(first, Blame) and first.worker in (1, 2, 3, 4)
    culprit = min({1, 2} - {first.worker})
    _, second, _ = shop.down(1.0, culprit, everyone)
    assert isinstance(second, Blame)
    assert second.worker not in (0, first.worker, culprit), "neither the failed nor the blamed"
    # with every other node out, the culprit is blamed after all
    (last,) = {0, 1, 2, 3, 4} - {0, first.worker, culprit, second.worker}
    (alone,) = shop.down(2.0, last, everyone)
    assert isinstance(alone, Repair) and alone.worker == last
    shop.up(60.0, 0)
    shop.up(70.0, first.worker)  # back in service: the only one blamable again
    _, again, _ = shop.down(80.0, 0, everyone)
    assert isinstance(again, Blame) and again.worker == first.worker


def test_wrong_blames_happen_at_their_rate_on_uniform_innocents_and_change_nothing_else() -> None:
    n, p = 20_000, 0.3
    policy = RepairPolicy(auto_s=7200.0, manual_s=86400.0, manual_p=0.5, diagnosis_p=0.9,
                          wrong_blame_p=p)
    shop = _shop(policy, up=10 ** 6, want=0, target=0)
    out = []
    for k in range(n):
        acts = shop.down(float(k), 10 + k, lambda: range(10))
        for blame in (a for a in acts if isinstance(a, Blame)):
            shop.up(float(k), blame.worker)  # repaired at once: each stays innocent
        out.append(acts)
    blames = [a for acts in out for a in acts if isinstance(a, Blame)]
    rate = 0.9 * p  # only a diagnosed failure can be misdiagnosed
    assert abs(len(blames) / n - rate) < 4 * math.sqrt(rate * (1 - rate) / n), len(blames)
    counts = Counter(b.worker for b in blames)
    assert set(counts) == set(range(10))
    assert max(counts.values()) - min(counts.values()) < 0.25 * len(blames) / 10, counts
    # the failed node's time out of service and its fix meet the closed forms with blames
    first = [acts[0] for acts in out]
    mean = sum(r.back_at_s - k for k, r in enumerate(first)) / n  # type: ignore[union-attr]
    expected = policy.mean_repair_s()
    assert expected == pytest.approx(0.9 * 0.7 * (7200.0 + 43200.0) + (1 - 0.63) * 600.0)
    assert abs(mean - expected) < 4 * 2 * expected / math.sqrt(n), (mean, expected)
    cured = sum(r.cured for r in first) / n  # type: ignore[union-attr]
    assert abs(cured - policy.fix_p()) < 4 * math.sqrt(policy.fix_p() / n), cured
    # without wrong blames the innocents are never asked for, and the draws are as before
    plain = RepairPolicy(auto_s=7200.0, manual_s=86400.0, manual_p=0.5, diagnosis_p=0.9)
    a, b = _shop(plain, up=100, want=0, target=0), _shop(plain, up=100, want=0, target=0)
    assert [a.down(1.0, w, _nobody_asked) for w in range(50)] == [b.down(1.0, w) for w in range(50)]
    right = [acts[0] for acts in out if not any(isinstance(x, Blame) for x in acts)]
    again = _shop(plain, up=10 ** 6, want=0, target=0)
    twins = [again.down(float(k), 10 + k)[0] for k in range(n)]
    assert set(right) <= set(twins)  # a right diagnosis repairs as it did without blames


def test_an_innocents_repairs_draw_from_its_own_stream() -> None:
    policy = RepairPolicy(wrong_blame_p=1.0)
    one, two = _shop(policy, up=100, want=0, target=0), _shop(policy, up=100, want=0, target=0)

    def blamed_twice(shop: RepairShop) -> list[Repair]:
        trips = []
        for k in range(2):
            trips.append(shop.down(float(k), 20 + k, lambda: [7])[2])
            shop.up(float(k), 7)  # repaired: innocent again
        return trips

    # node 7 blamed twice: its two trips differ; the same on a second shop
    trips = blamed_twice(one)
    assert trips == blamed_twice(two)
    assert trips[0].worker == trips[1].worker == 7 and trips[0].back_at_s != trips[1].back_at_s - 1.0
    # its own failure later draws from repair/7 as if it had never been blamed
    fresh = _shop(RepairPolicy(wrong_blame_p=0.0), up=100, want=0, target=0)
    mine = one.down(5.0, 7, lambda: [])[0]
    assert mine == fresh.down(5.0, 7)[0]


def test_a_node_failing_too_often_in_the_window_is_retired_not_repaired() -> None:
    shop = _shop(RepairPolicy(fixed_s=1.0, retire_after=3, retire_window_s=100.0))
    assert [type(a) for a in shop.down(0.0, 2) + shop.down(50.0, 2)] == [Repair, Repair]
    assert shop.down(200.0, 2) == [Repair(2, 201.0, "fixed", False)]  # 0 and 50 left the window
    assert shop.down(250.0, 2) == [Repair(2, 251.0, "fixed", False)]  # two in the window
    assert shop.down(260.0, 2) == [Retire(2, 3)]
    assert shop.retired == {2}
    with pytest.raises(AssertionError):
        shop.down(300.0, 2)


def test_spares_are_pulled_one_preemption_at_a_time_up_to_the_target() -> None:
    shop = _shop(None, up=6, want=4, target=6, pool=4, preempt_s=100.0, first_pool_id=20)
    assert shop.down(0.0, 0) == [] and shop.down(1.0, 1) == []  # 4 left: enough
    assert shop.down(10.0, 2) == [Pull(20, 110.0), Pull(21, 210.0), Pull(22, 310.0)]  # to 6
    assert shop.down(20.0, 3) == [] and shop.down(30.0, 4) == []  # 1 up + 3 coming: enough
    assert shop.down(40.0, 5) == [Pull(23, 410.0)]  # queued behind the others; pool empty
    shop.up(110.0, 20, pulled=True)
    assert shop.coming == 3 and shop.in_service == 1 and shop.pool_left == 0


def test_scripted_joins_count_as_nodes_in_service() -> None:
    shop = _shop(None, up=4, want=4, target=4, pool=2, preempt_s=5.0, first_pool_id=9)
    shop.joined(0.0, 8)
    assert shop.down(1.0, 0) == []  # a joined node covers the loss
    assert shop.down(2.0, 1) == [Pull(9, 7.0)]


def test_warm_standbys_cap_the_processes_and_an_idle_node_refills_them() -> None:
    """``want + warm`` nodes hold a process: the idle nodes wait, longest
    idle first, and one is made a standby (after ``select_s``) whenever a
    node with a process fails; a repaired node takes a free place or waits."""
    fixed = RepairPolicy(fixed_s=50.0)
    shop = _shop(fixed, up=7, want=4, target=7, warm=1, select_s=30.0)
    assert shop.initial == 5 and shop.idle == [5, 6]
    assert shop.down(10.0, 0) == [Repair(0, 60.0, "fixed", False), Warm(5, 40.0, False)]
    assert shop.down(15.0, 6) == [Repair(6, 65.0, "fixed", False)]  # idle: no process lost
    assert shop.down(20.0, 1) == [Repair(1, 70.0, "fixed", False)]  # nobody idle is left
    assert shop.warmed(40.0, 5) and not shop.warmed(40.0, 5)  # its process starts, once
    assert shop.up(60.0, 0)  # a free place: its process starts at once
    assert not shop.up(65.0, 6) and shop.idle == [6]  # full: it waits idle
    assert shop.down(80.0, 2) == [Repair(2, 130.0, "fixed", False), Warm(6, 110.0, True)]
    assert shop.down(90.0, 6) == [Repair(6, 140.0, "fixed", False)]  # during its selection
    assert not shop.warmed(110.0, 6)  # it failed: no process starts
    assert shop.busy == 4 and shop.up(70.0, 1)


def test_with_warm_standbys_pulls_stop_at_the_places_for_processes() -> None:
    """AIReSim tops the pool up to job size + standbys: a spare preempted from
    other work is never left idle."""
    shop = _shop(None, up=5, want=4, target=6, pool=4, preempt_s=100.0, first_pool_id=20,
                 warm=1)
    assert shop.down(0.0, 0) == []  # four left: enough
    assert shop.down(10.0, 1) == [Pull(20, 110.0), Pull(21, 210.0)]  # to 5, not 6
    assert shop.up(110.0, 20, pulled=True) and shop.busy == 5


def test_no_warm_limit_starts_every_node_in_service() -> None:
    shop = _shop(RepairPolicy(fixed_s=5.0), up=6, want=4, target=6)
    assert shop.initial == 6 and shop.idle == []
    assert shop.down(1.0, 0) == [Repair(0, 6.0, "fixed", False)] and shop.up(6.0, 0)


def test_select_s_needs_warm_standbys() -> None:
    with pytest.raises(ScenarioError, match="warm_standbys"):
        parse_scenario("name: x\ncluster: {spares: 2, select_s: 60.0}\n")


def test_a_warm_standby_replaces_a_lost_member_and_an_idle_spare_takes_its_place(
        tmp_path: Path) -> None:
    """On the sim: spare 6 runs a process and waits as a standby, spares 7
    and 8 are idle. Each kill admits a standby at once; the idle spare that
    waited longest is made the next one ``select_s`` after the kill."""
    summary, history = _run(tmp_path, """
name: warm-standbys
cluster: {workers: 6, spares: 3, warm_standbys: 1, select_s: 60.0, repair_s: 100000.0}
workload: {steps: 400, global_batch: 12, micro_batch: 1, micro_batch_s: 1.0, allreduce_s: 0.0,
           dataset_samples: 100000}
rendezvous: {min_workers: 4, max_workers: 6, last_call_s: 1.0}
failures: {schedule: [{at_s: 10.0, kill: 2}, {at_s: 200.0, kill: 3}]}
strategy: {kind: elastic}
""")
    assert summary["completed"] and summary["valid"], summary["violations"]
    warms = [(r["t"], r["workers"]) for r in history if r.get("kind") == "warm"]
    assert warms == [(70.0, [7]), (260.0, [8])]
    gens = [(r["reason"], members_of(r)) for r in history if r["f"] == "generation"]
    assert gens == [("start", (0, 1, 2, 3, 4, 5)), ("failure", (0, 1, 3, 4, 5, 6)),
                    ("failure", (0, 1, 4, 5, 6, 7))]
    entered = {r["process"] for r in history if r["f"] == "enter"}
    assert 8 not in entered  # the last warmed spare waits as a standby


def _run(tmp: Path, yaml: str) -> tuple[dict, list[dict]]:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    summary = Simulation(parse_scenario(yaml), tmp, ledger=False).run()
    return summary, list(read_history(tmp))


def test_nodes_in_repair_are_the_finite_source_mginf_queue(tmp_path: Path) -> None:
    n, mtbf = 200, 864000.0
    summary, history = _run(tmp_path, f"""
name: repair-mginf
seed: 3
cluster: {{workers: {n}, spares: 0, repair: {{auto_s: 7200.0, manual_s: 86400.0, manual_p: 0.5,
          auto_fail_p: 0.4, manual_fail_p: 0.2, diagnosis_p: 0.9, reboot_s: 600.0}}}}
workload: {{steps: 5000, global_batch: {n}, micro_batch: 1, micro_batch_s: 1000.0,
           allreduce_s: 0.0, dataset_samples: 1000000}}
failures: {{worker_mtbf_s: {mtbf}}}
detector: {{heartbeat_s: 5.0, timeout_s: 30.0}}
rendezvous: {{min_workers: 20, max_workers: {n}, last_call_s: 5.0}}
strategy: {{kind: elastic, checkpoint_interval_steps: 100}}
""")
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["crashes"] > 3000, summary["crashes"]  # ~350 repair times long
    end = summary["elapsed_s"]
    changes = sorted((r["t"], 1 if r["kind"] == "crash" else -1) for r in history
                     if r["f"] == "fault" and r.get("kind") in ("crash", "repair"))
    time_at: Counter[int] = Counter()
    down, last = 0, 0.0
    for t, step in changes:
        if t > end:
            break
        time_at[down] += t - last
        down, last = down + step, t
        assert down >= 0
    time_at[down] += end - last
    mean = sum(k * w for k, w in time_at.items()) / end
    var = sum(k * k * w for k, w in time_at.items()) / end - mean * mean
    p = PIPELINE.mean_repair_s() / (mtbf + PIPELINE.mean_repair_s())
    assert mean == pytest.approx(n * p, rel=0.08), (mean, n * p)
    assert var == pytest.approx(n * p * (1 - p), rel=0.3), (var, n * p * (1 - p))
    availability = 1.0 - mean / n
    assert availability == pytest.approx(mtbf / (mtbf + PIPELINE.mean_repair_s()), abs=0.005)
    hows = Counter(r.get("how") for r in history if r.get("kind") == "repair")
    assert set(hows) == {"auto", "manual", "undiagnosed"}


def test_a_cold_spare_is_pulled_after_its_preemption_and_joins(tmp_path: Path) -> None:
    summary, history = _run(tmp_path, """
name: spare-pool
cluster: {workers: 6, spares: 0, spare_pool: 2, preempt_s: 100.0}
workload: {steps: 400, global_batch: 12, micro_batch: 1, micro_batch_s: 1.0, allreduce_s: 0.0,
           dataset_samples: 100000}
rendezvous: {min_workers: 4, max_workers: 6, last_call_s: 1.0}
failures: {schedule: [{at_s: 10.0, kill: 2}]}
strategy: {kind: elastic}
""")
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["pulled"] == 1
    pulls = [r for r in history if r.get("kind") == "pull"]
    assert [(r["t"], r["workers"]) for r in pulls] == [(110.0, [6])]  # the first pool id
    gens = [r for r in history if r["f"] == "generation"]
    assert gens[-1]["t"] > 110.0 and gens[-1]["reason"] == "growth"


# every diagnosis blames the wrong node: a live member goes to a 300 s
# automated repair, the culprit is back after a 50 s reboot
WRONG_BLAME = """
name: wrong-blame
cluster: {{workers: {workers}, spares: 0, {rack}repair: {{auto_s: 300.0, manual_p: 0.0,
          auto_fail_p: 0.0, wrong_blame_p: 1.0, reboot_s: 50.0}}}}
workload: {{steps: 600, global_batch: {workers}, micro_batch: 1, micro_batch_s: 1.0,
           allreduce_s: 0.0, dataset_samples: 100000}}
detector: {{heartbeat_s: 1.0, timeout_s: 5.0}}
rendezvous: {{min_workers: 2, max_workers: {workers}, last_call_s: 1.0}}
failures: {{schedule: [{{at_s: 10.0, {fault}}}]}}
strategy: {{kind: elastic}}
"""


def test_a_wrong_blame_on_the_sim_takes_an_innocent_member_out_until_its_repair(
        tmp_path: Path) -> None:
    summary, history = _run(tmp_path, WRONG_BLAME.format(workers=6, rack="", fault="kill: 2"))
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["blames"] == 1 and summary["kills"] == 1 and summary["failures"] == 1
    (blame,) = [r for r in history if r.get("kind") == "blame"]
    innocent = blame["workers"][0]
    assert blame["t"] == 10.0 and blame["culprit"] == 2 and innocent != 2
    kinds = [r.get("kind") for r in history if r["f"] == "fault"]
    assert kinds.index("kill") < kinds.index("blame")  # the culprit's record first
    evicted = {(r["worker"], r["reason"]) for r in history if r["f"] == "evict"}
    assert {(2, "exited"), (innocent, "exited")} <= evicted  # both hosts report the exit
    repairs = {r["workers"][0]: r for r in history if r.get("kind") == "repair"}
    assert repairs[2]["t"] == 60.0 and repairs[2]["how"] == "misdiagnosed"
    assert repairs[innocent]["how"] == "auto" and repairs[innocent]["t"] > 10.0
    last = [r for r in history if r["f"] == "generation"][-1]
    assert members_of(last) == tuple(range(6))  # both back, after the innocent's repair


def test_a_rack_lost_with_wrong_blames_blames_distinct_innocents_outside_it(
        tmp_path: Path) -> None:
    summary, history = _run(tmp_path, WRONG_BLAME.format(workers=8, rack="rack_size: 2, ",
                                                         fault="kill_rack: 1"))
    assert summary["completed"] and summary["valid"], summary["violations"]
    blames = [r for r in history if r.get("kind") == "blame"]
    assert sorted(b["culprit"] for b in blames) == [2, 3]
    innocents = [b["workers"][0] for b in blames]
    assert len(set(innocents)) == 2 and not set(innocents) & {2, 3}, innocents
    assert summary["blames"] == 2 and summary["failures"] == 2
    back = sorted(r["workers"][0] for r in history if r.get("kind") == "repair")
    assert back == sorted([2, 3, *innocents])  # each node repaired once
    assert members_of([r for r in history if r["f"] == "generation"][-1]) == tuple(range(8))


def test_a_fresh_process_asks_to_join_launch_s_after_its_node_is_up(tmp_path: Path) -> None:
    body = """
name: spare-pool-launch
cluster: {{workers: 6, spares: 0, spare_pool: 1, preempt_s: 100.0, launch_s: {launch}}}
workload: {{steps: 400, global_batch: 12, micro_batch: 1, micro_batch_s: 1.0, allreduce_s: 0.0,
           dataset_samples: 100000}}
rendezvous: {{min_workers: 4, max_workers: 6, last_call_s: 1.0}}
failures: {{schedule: [{{at_s: 10.0, kill: 2}}, {{at_s: {again}, kill: 3}}]}}
strategy: {{kind: elastic}}
"""
    growth = {}
    for launch in (0.0, 30.0):
        summary, history = _run(tmp_path / str(launch), body.format(launch=launch, again=500.0))
        assert summary["completed"] and summary["valid"], summary["violations"]
        opened = [r["t"] for r in history if r["f"] == "round" and r.get("reason") == "growth"]
        growth[launch] = opened[0]
        assert [r["t"] for r in history if r.get("kind") == "pull"] == [110.0]
    assert growth[30.0] - growth[0.0] == pytest.approx(30.0)
    # a node that fails while its process starts never asks to join: a kill at
    # 120 s (the pulled node, id 6) lands during its 30 s launch
    summary, history = _run(tmp_path / "dies", body.format(launch=30.0, again=120.0).replace(
        "kill: 3", "kill: 6"))
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert not any(r["f"] == "round" and r.get("reason") == "growth" for r in history)


AGING = """
name: age-computing
seed: 1
cluster: {{workers: 8, spares: 8, repair_s: 500.0}}
workload: {{steps: 100000, global_batch: 8, micro_batch: 1, micro_batch_s: 1.0, allreduce_s: 0.0,
           dataset_samples: 1000000}}
failures: {{worker_mtbf_s: 8000.0, age: {age}}}
detector: {{heartbeat_s: 1.0, timeout_s: 5.0}}
rendezvous: {{min_workers: 8, max_workers: 8, last_call_s: 1.0}}
strategy: {{kind: checkpoint-restart, checkpoint_interval_steps: 50, checkpoint_write_s: 1.0,
           restart_s: 3000.0}}
"""


def test_computing_age_fails_only_members_and_only_while_the_job_computes(tmp_path: Path) -> None:
    """AIReSim's assumption: a restart three times the job's MTBF long
    costs no failures, so the job finishes with about one failure per 1,000
    s of compute (8 members at 8,000 s each); aging always, the 16 nodes
    would fail about 50 times per restart and the job would never finish."""
    summary, history = _run(tmp_path, AGING.format(age="computing"))
    assert summary["completed"] and summary["valid"], summary["violations"]
    compute_s = 100_000 + 2_000  # steps and checkpoints, + the steps redone after each failure
    expected = compute_s / 1000.0
    assert abs(summary["crashes"] - expected) < 4 * math.sqrt(expected) + 30, summary["crashes"]
    down = False  # between a crash and the generation the restart formed, nothing computes
    for r in history:
        if r.get("kind") == "crash":
            assert not down, f"a crash while the job was down: {r}"
            down = True
        elif r["f"] == "generation":
            down = False


def test_computing_age_is_sim_only_and_one_repair_is_given() -> None:
    with pytest.raises(ScenarioError, match="sim only"):
        parse_scenario(AGING.format(age="computing").replace("name:", "target: real\nname:"))
    with pytest.raises(ScenarioError, match="not both"):
        parse_scenario("name: x\ncluster: {repair_s: 5.0, repair: {auto_s: 5.0}}\n")
    with pytest.raises(ScenarioError, match="retire_after"):
        parse_scenario("name: x\ncluster: {repair: {retire_window_s: 5.0}}\n")


# no warm standby at all: a repaired node waits idle, and is made the
# standby (a `warm` record, its new life handed out by the keeper) only when
# the next member is lost. The second kill comes seconds after the first
# warmed spare joined on real (a fresh process starts in 1-2 s here; 8 s
# leaves room beside a CPU hog), and seconds before the end.
WARM_BACK = """
name: warm-back
seed: 0
target: real
cluster: {workers: 3, spares: 1, warm_standbys: 0, select_s: 0.3, repair_s: 1.0}
workload: {steps: 3000, global_batch: 24, micro_batch: 4, dataset_samples: 480,
           model_params: 20000}
detector: {heartbeat_s: 0.1, timeout_s: 2.0}
rendezvous: {min_workers: 2, max_workers: 3, last_call_s: 0.2, join_timeout_s: 5.0}
strategy: {kind: elastic, batch: constant, checkpoint_interval_steps: 100}
failures:
  schedule:
    - {at_step: 10, kill: 1}
    - {at_s: 8.0, kill: 2}
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["sim", pytest.param("real", marks=REAL_PROCESSES)])
def test_a_repaired_node_waits_idle_until_it_is_made_a_warm_standby(
        target: str, tmp_path: Path) -> None:
    """On both targets: the idle spare is warmed at the first kill; worker 1,
    back from repair with every place taken, waits without a process, and
    the second kill makes it the standby: it joins as its next life."""
    from real import driver as real_driver
    from sim import driver as sim_driver

    sc = parse_scenario(WARM_BACK.replace("target: real", f"target: {target}"))
    summary = (real_driver if target == "real" else sim_driver).run(sc, tmp_path)
    assert summary["completed"] and summary["valid"], summary.get("violations")
    history = list(read_history(tmp_path))
    kinds = [(r["kind"], r["workers"]) for r in history if r["f"] == "fault"]
    assert [k for k in kinds if k[0] in ("kill", "warm")] == \
        [("kill", [1]), ("warm", [3]), ("kill", [2]), ("warm", [1])]
    # a kill is reported by its exit or by a survivor's failed step, whichever
    # reaches the keeper first on real (tests/test_conformance.py, rule 2)
    gens = [("failure" if r["reason"] == "step-failed" else r["reason"], members_of(r))
            for r in history if r["f"] == "generation"]
    assert gens == [("start", (0, 1, 2)), ("failure", (0, 2)), ("growth", (0, 2, 3)),
                    ("failure", (0, 3)), ("growth", (0, 1, 3))]
    back = [r for r in history if r["f"] == "enter" and r["process"] == 1][-1]
    assert back["incarnation"] == 1 and back["gen"] == 5


IDLE_AT_TAKEOVER = """
name: idle-at-takeover
seed: 3
target: sim
cluster: {workers: 4, spares: 1, warm_standbys: 0, repair_s: 0.5}
workload: {steps: 400, global_batch: 32, micro_batch: 4, dataset_samples: 3200,
           micro_batch_s: 0.1}
strategy: {kind: checkpoint-restart, restart_s: 1.0, checkpoint_interval_steps: 10}
keeper: {store: etcd, standbys: 1, failover_s: 2.0}
failures:
  schedule:
    - {at_s: 10, kill: 1}
    - {at_s: 10.7, kill_keeper: active}
    - {at_s: 30, kill: 3}
"""


def test_a_repaired_node_held_idle_is_down_to_the_keeper_that_takes_over(
        tmp_path: Path) -> None:
    """Worker 1 is killed and repaired, and waits idle (every place is
    taken), while the keeper that was told it is down dies before the next
    generation forms. The new keeper is told it is down too (as on real:
    not given back to the job), so it relaunches no process there; it gets
    one when the repair shop warms it after the next kill."""
    sc = parse_scenario(IDLE_AT_TAKEOVER)
    summary = Simulation(sc, tmp_path).run()
    assert summary["completed"] and summary["valid"], summary.get("violations")
    history = list(read_history(tmp_path))
    takeover = next(r for r in history if r["f"] == "takeover")
    repaired = next(r for r in history if r["f"] == "fault" and r["kind"] == "repair")
    assert repaired["workers"] == [1] and repaired["t"] < takeover["t"]
    relaunch = next(r for r in history if r["f"] == "relaunch" and r["t"] >= takeover["t"])
    assert relaunch["not_relaunched"] == [[1, 1]], relaunch
    warms = [(r["t"], r["workers"]) for r in history if r["f"] == "fault" and r["kind"] == "warm"]
    assert warms == [(10.0, [4]), (30.0, [1])], warms
