"""Conformance: on one scenario the sim and the real target decide the same.

Each shipped real scenario with scripted faults (``scenarios/real-*.yaml``),
the regression scenario ``tests/data/scenarios/chaos-cr-kill-join-kill.yaml``
and four that cross fault families (``cross-lose-host-kill-keeper``: a host
lost, then the active keeper killed; ``cross-partition-restart``: a kill
under checkpoint-restart while the other host is partitioned away;
``cross-join-during-roll-call``: a newcomer arriving during the roll call
a kill opened; ``cross-slow-late-heartbeats``: a straggler evicted, then
late heartbeats from the roll call that opens; the last two are triggered
by that protocol event, ``at_roll_call``) runs once on each target: all
twenty-four have a schedule, none has random lifetimes, so none is skipped.
:mod:`rollcall.app.decisions` reads the decision sequence from each history
alone: generations (gen, members, cursor, source, stale, reason),
evictions (worker, incarnation, reason), restarts (gen, reason), relaunch
sets (gen, workers, incarnations: the keeper's ``relaunch`` record), the
keeper giving up (gen, reason) and the end (completed, cursor). Both
sequences must be equal field by field, except where the scenario does not
determine a field; those are masked (shown as ``<not compared>`` in a
diff) or dropped by seven rules, each applied wherever its condition holds:

1. A killed worker's eviction is compared whole: its host reports the
   exit on both targets (the real launcher through a pidfd, the sim one
   ``network.latency_s`` after the kill), so the keeper evicts it
   ``exited`` on both (``test_killed_worker_eviction_reason`` asserts it on
   its own). Nothing is masked.
2. A kill is reported by the exit or the detector (the generation's or
   restart's reason ``failure``) or by a survivor's failed allreduce
   (``step-failed``), whichever reaches the keeper first: a race of two true
   reports on real, always the detector on the sim. So a ``failure`` or
   ``step-failed`` reason is masked in a scenario that kills. Under
   checkpoint-restart (``real-checkpoint-restart``, ``chaos-cr-kill-join-kill``)
   the killed workers' evictions are dropped too: after ``step-failed`` the
   dead life is never evicted (its exit names a life the restart already
   ended). Who is relaunched, as which life, and where the job resumes do
   not depend on the race and are compared.
3. A ``growth`` generation (``real-join-one``, ``real-pause-one``,
   ``real-roll-call-kill``): its round opens when the newcomer's (or the
   woken worker's) Join reaches the keeper, a process wake-up after the
   trigger (``for_s`` of wall time after a pause), while the members keep
   committing steps; a member whose commit the opening round refused is
   stale too. So its ``cursor``, ``source`` and ``stale`` are timing: masked.
   Its members, reason and gen are compared.
4. An ``at_s`` fault (``chaos-cr-kill-join-kill``'s join at 1.07 s): on the
   sim it lands before the kill at step 11 (a growth generation, then a
   restart of four), on real (faster steps) usually after it (the newcomer
   joins the restart round), so generation numbers, growth generations,
   evictions and relaunch sets (who, and which life: the newcomer's second
   relaunch is its life 1 or 2) depend on the machine's speed. Compared:
   every kill's target (seeded picks among the same live members in either
   order), the generations each restart formed (members, cursor, source,
   stale), how many restarts, and the end.

5. ``isolate_keeper`` (``real-isolate-keeper``): the cut goes in before
   the keeper's answer to the last member's commit of the scripted step N
   (``rollcall.core.step_faults``), and the isolated members, whose peers
   still reach them, wait for commit answers that cannot come, so the job
   stalls until the detector evicts them, on both targets. Where it
   stalls is a race on real: when the last member answered is on the cut
   host it never starts step N+1, and the cursor of the generation formed
   on the eviction (reason ``failure``) is N; when it is elsewhere, the
   isolated members run N+1 with their peers and the others' votes commit
   it: N+1. The sim votes once for the whole generation and commits the
   step in flight: N+1. So real's cursor there is the sim's or one step
   less (asserted), and the cursor is then masked.

6. ``delay`` (``real-delay-host``): on real the delay is the host agent's
   relay of the keeper link (no netem here), so the gloo exchange is not
   delayed, while the sim's exchange waits for the slow link: the
   survivors may commit a step more on real before the eviction. Masked:
   the cursor of the generation formed on the eviction.

7. ``late_heartbeats`` (``real-late-heartbeats``): the late worker's work
   and commit votes are on time on both targets, so the job commits on
   until the detector evicts it: the cursor of the generation formed on
   the eviction is the machine's speed over the timeout, and the round
   opens wherever a step stands then, so a survivor whose commit it
   refused is stale on real (as in rule 3; the sim's steps are whole).
   Masked: that generation's cursor, source and stale.

Everything else is compared exactly. By scenario (``gen N`` is a
generation, all its fields unless named; "end" is completed and cursor):

=========================  ===================================================
real-below-min             gen 1; the eviction; give-up (gen, reason); end
real-checkpoint-restart    gen 1; restart (gen); relaunch (gen, workers,
                           incarnations); gen 2; end
real-join-one              gen 1; gen 2 (gen, members, reason); end
real-kill-one,             gen 1; the evictions; gen 2 (gen, members, cursor,
real-kill-two              source, stale); end
real-late-heartbeats       gen 1; the late worker's eviction (timeout); gen 2
                           (gen, members, reason); gen 3 (growth); end
real-lose-host             gen 1; both lost workers' evictions (timeout: no
                           exit is reported); gen 2 (all but reason); end
                           (its hosts run as network namespaces on real:
                           skipped, with the reason, without root)
real-partition,            gen 1; both cut-off workers' evictions (timeout);
real-isolate-keeper,       gen 2 (all but its cursor after a delay; after
real-delay-host            an isolation, real's cursor is the sim's or one
                           step less);
                           gen 3, the heal's readmission of both (gen,
                           members, reason); end (their hosts run as network
                           namespaces on real: skipped without root)
real-loss-host             gen 1 (nobody is evicted: TCP retransmits what
                           the lossy link drops); end (namespaces on real)
real-spare-pool            gen 1; the eviction; gen 2; gen 3 (growth: the
                           spare pulled from the cold pool; gen, members,
                           reason); end
real-warm-standby          gen 1; the eviction; gen 2 (the warm standby
                           admitted); end
real-pause-one             gen 1; the eviction (worker, incarnation, reason);
                           gen 2; gen 3 (gen, members, reason); end
real-straggler             gen 1; the straggler's eviction (worker,
                           incarnation, reason ``straggler``); gen 2 (all:
                           the real worker's slowness starts at the fault's
                           step, as on the sim); gen 3 (growth: its
                           readmission after the holdout); end
real-keeper-failover       gen 1; gen 2 (failover: the active keeper killed
                           once every member holds step 12, on the sim too);
                           the eviction; gen 3; gen 4 (failover); end (etcd
                           on real: skipped, with the reason, without it)
real-keeper-failover-      the same, the workers finding each keeper in
direct                     etcd themselves (``keeper.worker_links: direct``)
real-roll-call-kill        gen 1; the killed worker's eviction and the
                           paused one's; gen 2 (all but reason); gen 3 (gen,
                           members, reason); end
chaos-cr-kill-join-kill    kills; restart-formed generations (members,
                           cursor, source, stale); number of restarts; end
cross-lose-host-kill-      gen 1; both lost workers' evictions (timeout);
keeper                     gen 2 (all: the failure's); gen 3 (failover, the
                           keeper killed once every member holds step 25);
                           end (namespaces and etcd on real)
cross-partition-restart    gen 1; the killed worker's eviction (exited);
                           restart (gen); relaunch (gen, workers,
                           incarnations: the cut host's workers too); gen 2
                           (all: it forms once the cut heals); end
                           (namespaces on real)
cross-join-during-         gen 1; the killed worker's eviction (exited);
roll-call                  gen 2 (all but reason: the newcomer admitted by
                           the roll call the kill opened); end
cross-slow-late-           gen 1; the straggler's eviction (straggler);
heartbeats                 gen 2 (all); the late worker's eviction
                           (timeout); gen 3 (gen, members, reason); gen 4
                           and 5 (growth: the late worker back as a
                           newcomer, then the straggler after its holdout;
                           gen, members, reason); end
=========================  ===================================================
 ``real-roll-call-kill`` runs as
shipped (kill 1 and pause 3 at step 10); the extra kill during the open roll
call is its end-to-end test's (tests/test_real_target.py), not the scenario's.

Random failures: the first kill hits the same worker on both targets, for
``kill: random`` (chaos) and for random lifetimes (``real-kill-one`` with
``worker_mtbf_s`` 1 s and no schedule: the first lifetime ends within the
first ~0.15 s of training on both targets), and a lifetime's end is the
machine's on both: fault kind ``crash``, evicted by the detector (no host is
left to report the exit).

Each scenario runs once per test run on each target, shared with the other
modules that check the same runs (tests/shipped_runs.py); a real run takes
4-11 s on an idle 2-core machine. Nothing waits on
time: each driver returns when its run is over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from rollcall.config import data_spec
from rollcall.core import FailureTally, check, time_account
from rollcall.core.accounting import TIME_KEYS
from rollcall.core.history import members_of
from rollcall.app.decisions import Decision, decisions, drop, first_difference, kills, mask
from rollcall.results import read_summary
from rollcall.scenario import Scenario, load_scenario
from real_processes import REAL_PROCESSES
from shipped_runs import Pair, scenario_path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

pytestmark = REAL_PROCESSES

SHIPPED = sorted(p.stem for p in SCENARIOS.glob("real-*.yaml")) + [
    "chaos-cr-kill-join-kill", "cross-join-during-roll-call", "cross-lose-host-kill-keeper",
    "cross-partition-restart", "cross-slow-late-heartbeats"]
# a scenario without a schedule, or with random lifetimes, has no scripted
# decisions to compare (none ships today; the coverage test keeps it so)
SKIPPED: dict[str, str] = {}
MTBF = ("real-kill-one", "failures.schedule=[]", "failures.worker_mtbf_s=1.0",
        "workload.steps=200")
FAILED = ("failure", "step-failed")  # the two reports of a member's failure (rule 2)
ELASTIC_KILLS = ["real-below-min", "real-kill-one", "real-kill-two", "real-roll-call-kill",
                 "real-spare-pool"]


@pytest.fixture(scope="module")
def runs(shipped_runs: Callable[..., Pair]) -> Callable[..., Pair]:
    """``runs(name, *overrides)``: the scenario's history on each target, made
    once per test run whichever test (of this module or another) asks first."""
    return shipped_runs


def comparable(sc: Scenario, ds: list[Decision], dead: set[int]) -> list[Decision]:
    """The decisions the scenario determines: the module docstring's rules 2-7
    (rule 1 masks nothing)."""
    if dead:  # rule 2
        for kind in ("generation", "restart"):
            ds = mask(ds, kind, ["reason"], when=lambda d: d["reason"] in FAILED)
    if dead and sc.strategy.kind == "checkpoint-restart":
        ds = drop(ds, "evict", when=lambda d: d["worker"] in dead)
    ds = mask(ds, "generation", ["cursor", "source", "stale"],  # rule 3
              when=lambda d: d["reason"] == "growth")
    if any(f.action in ("isolate_keeper", "delay") for f in sc.failures.schedule):  # rules 5-6
        ds = mask(ds, "generation", ["cursor"], when=lambda d: d["reason"] == "failure")
    if any(f.action == "late_heartbeats" for f in sc.failures.schedule):  # rule 7
        ds = mask(ds, "generation", ["cursor", "source", "stale"],
                  when=lambda d: d["reason"] == "failure")
    if any(f.trigger == "at_s" for f in sc.failures.schedule):  # rule 4
        ds = [d for d in ds if d["kind"] in ("restart", "end")
              or (d["kind"] == "generation" and d["reason"] == "restart")]
        ds = mask(mask(ds, "generation", ["gen"]), "restart", ["gen"])
    return ds


def test_every_shipped_real_scenario_is_covered() -> None:
    for name in SHIPPED:
        sc = load_scenario(scenario_path(name), [])
        unscripted = not sc.failures.schedule or sc.failures.worker_mtbf_s is not None
        assert unscripted == (name in SKIPPED), (name, "update SKIPPED and the docstring")
    assert len(SHIPPED) == 24, SHIPPED  # the docstring names each of them


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in SKIPPED])
def test_sim_and_real_make_the_same_decisions(runs: Callable[..., Pair], name: str) -> None:
    assert_same_decisions(runs(name))


def assert_same_decisions(pair: Pair) -> None:
    """The same kills, and the same decisions under the module's rules."""
    sc, sim, real, _ = pair
    assert kills(sim) == kills(real), (kills(sim), kills(real))
    dead = set(kills(sim))
    if any(f.action == "isolate_keeper" for f in sc.failures.schedule):  # rule 5
        ours, theirs = failure_steps(decisions(sim)), failure_steps(decisions(real))
        assert len(ours) == len(theirs) and all(
            sim_step - 1 <= real_step <= sim_step for sim_step, real_step in zip(ours, theirs)), (
            f"the job stalled elsewhere: sim {ours}, real {theirs}\n"
            f"{timeline('sim', sim)}\n{timeline('real', real)}")
    ours, theirs = comparable(sc, decisions(sim), dead), comparable(sc, decisions(real), dead)
    assert ours, "no decision to compare"
    diff = first_difference(ours, theirs)
    assert diff is None, f"{diff}\n{timeline('sim', sim)}\n{timeline('real', real)}"


def failure_steps(ds: list[Decision]) -> list[int]:
    """The steps at which each generation formed on a failure resumes."""
    return [d["cursor"][0] for d in ds if d["kind"] == "generation" and d["reason"] == "failure"]


def timeline(name: str, history: list[dict], limit: int = 40) -> str:
    """The first ``limit`` records of ``history`` that are not a step's
    (contribute, commit, enter, checkpoint): what a failure's reader needs
    to see why."""
    quiet = ("contribute", "commit", "enter", "checkpoint")
    lines = [f"{r.get('t', 0.0):10.4f} {r['process']!s:>8} {r['type']:<6} {r['f']} "
             + " ".join(f"{k}={v}" for k, v in r.items() if k not in ("t", "process", "type", "f"))
             for r in history if r["f"] not in quiet][:limit]
    return f"{name} history:\n  " + "\n  ".join(lines)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ELASTIC_KILLS)
def test_killed_worker_eviction_reason(runs: Callable[..., Pair], name: str) -> None:
    """Rule 1: a killed worker is evicted on its exit notice, on both targets."""
    _, sim, real, _ = runs(name)
    dead = set(kills(sim))
    assert dead, "the scenario kills nobody"

    def evictions(history: list[dict]) -> list[Decision]:
        return [d for d in decisions(history) if d["kind"] == "evict" and d["worker"] in dead]

    assert evictions(sim) and all(d["reason"] == "exited" for d in evictions(sim)), evictions(sim)
    diff = first_difference(evictions(sim), evictions(real))
    assert diff is None, diff


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", [("chaos-cr-kill-join-kill",), MTBF],
                         ids=["kill-random", "worker-mtbf"])
def test_first_random_kill_hits_the_same_worker(runs: Callable[..., Pair],
                                                case: tuple[str, ...]) -> None:
    _, sim, real, _ = runs(*case)
    assert kills(sim) and kills(real), (kills(sim), kills(real))
    assert kills(sim)[0] == kills(real)[0]


@pytest.mark.timeout(150)
def test_random_lifetime_end_is_one_fault_kind(runs: Callable[..., Pair]) -> None:
    """A lifetime's end is the machine's (``crash``) on both targets, and no
    exit is reported for it: the detector evicts the life (the real
    launcher's SIGKILL closes the process's sockets, so a survivor's failed
    step may open the round first, but the eviction stays the detector's)."""
    _, sim, real, _ = runs(*MTBF)

    def first(history: list[dict]) -> dict:
        return next(r for r in history if r["f"] == "fault" and r["kind"] != "join")

    assert first(sim)["kind"] == first(real)["kind"] == "crash"
    for history in (sim, real):
        w = first(history)["workers"][0]
        evicted = [d["reason"] for d in decisions(history) if d["kind"] == "evict"
                   and d["worker"] == w and d["incarnation"] == 0]
        assert evicted == ["timeout"], (w, evicted)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in SKIPPED])
def test_failures_mean_the_same_on_both_targets(runs: Callable[..., Pair], name: str) -> None:
    """The summary's ``failures`` (one definition, read from the history):
    a scripted scenario's count is the same on sim and real; a pause counts
    only where the keeper evicted the paused worker (real-pause-one: yes)."""
    _, sim, real, _ = runs(name)
    assert FailureTally.of(sim) == FailureTally.of(real), (name, kills(sim), kills(real))
    if name == "real-pause-one":
        assert FailureTally.of(sim) == 1


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in SKIPPED])
def test_time_metrics_mean_the_same_on_both_targets(runs: Callable[..., Pair], name: str) -> None:
    """Each target's summary times (elapsed, productive, checkpoint, lost,
    recovery, stall) are the core's account of its own history."""
    sc, sim, real, out = runs(name)
    for target, history in (("sim", sim), ("real", real)):
        summary = read_summary(out / target)
        account = time_account(history, check(history, data_spec(sc)).lineage,
                               summary["completed"])
        for key in TIME_KEYS:
            assert summary[key] == pytest.approx(getattr(account, key), abs=1e-6), (target, key)


@pytest.mark.timeout(150)
def test_a_lost_host_is_left_to_the_detector_on_both_targets(runs: Callable[..., Pair]) -> None:
    """``lose_host``: every process of the machine at once, no exit reported:
    the keeper evicts each for its silence (``timeout``), never ``exited``."""
    _, sim, real, _ = runs("real-lose-host")
    for history in (sim, real):
        (lost,) = [r for r in history if r["f"] == "fault" and r["kind"] == "lose_host"]
        assert lost["host"] == 1 and lost["workers"] == [2, 3], lost
        evicted = sorted((d["worker"], d["reason"]) for d in decisions(history)
                         if d["kind"] == "evict")
        assert evicted == [(2, "timeout"), (3, "timeout")], evicted
        assert FailureTally.of(history) == 2


@pytest.mark.timeout(150)
def test_a_cold_spare_is_pulled_on_both_targets(runs: Callable[..., Pair]) -> None:
    """The repair shop is the core's: the kill retires its node
    (``retire_after: 1``), which leaves three nodes in service, so the one
    spare of the pool (the first id after the workers) is pulled
    ``preempt_s`` after it on both targets, and joins."""
    sc, sim, real, _ = runs("real-spare-pool")
    for history in (sim, real):
        faults = [r for r in history if r["f"] == "fault"]
        assert [(r["kind"], r["workers"]) for r in faults] == \
            [("kill", [1]), ("retire", [1]), ("pull", [4])]
        assert faults[1]["failures"] == 1 and faults[1]["t"] == faults[0]["t"]
        assert faults[2]["t"] - faults[0]["t"] >= sc.cluster.preempt_s - 1e-9
        grown = [d for d in decisions(history) if d["kind"] == "generation"][-1]
        assert grown["reason"] == "growth" and grown["members"] == [[0, 0], [2, 4]]


@pytest.mark.timeout(150)
def test_an_idle_spare_is_made_a_warm_standby_on_both_targets(runs: Callable[..., Pair]) -> None:
    """``cluster.warm_standbys`` is the core repair shop's: of the two spares
    only the first runs a process at the start; the kill retires worker 1,
    the warm standby (worker 3) is admitted at the roll call, and the idle
    spare (worker 4) is made the next standby ``select_s`` after the kill,
    on both targets."""
    sc, sim, real, _ = runs("real-warm-standby")
    for history in (sim, real):
        faults = [r for r in history if r["f"] == "fault"]
        assert [(r["kind"], r["workers"]) for r in faults] == \
            [("kill", [1]), ("retire", [1]), ("warm", [4])]
        assert faults[2]["t"] - faults[0]["t"] >= sc.cluster.select_s - 1e-9
        gens = [d for d in decisions(history) if d["kind"] == "generation"]
        assert [g["members"] for g in gens] == [[[0, 2]], [[0, 0], [2, 3]]]
        entered = {r["process"] for r in history if r["f"] == "enter"}
        assert entered == {0, 1, 2, 3}, entered  # worker 4 waits as a standby


@pytest.mark.timeout(150)
def test_a_restart_budget_gives_up_at_the_same_decision_on_both_targets(
        runs: Callable[..., Pair]) -> None:
    """``strategy.max_restarts`` is the core keeper's decision: with a budget
    of 0 the first kill ends the job, at the same generation and step, with
    the same reason, on sim and real."""
    sc, sim, real, _ = runs("real-checkpoint-restart", "strategy.max_restarts=0")
    dead = set(kills(sim))
    ours, theirs = comparable(sc, decisions(sim), dead), comparable(sc, decisions(real), dead)
    assert [d for d in ours if d["kind"] == "give-up"], ours
    assert not [d for d in ours if d["kind"] == "restart"], ours
    diff = first_difference(ours, theirs)
    assert diff is None, diff


@pytest.mark.timeout(150)
def test_a_wrong_blame_takes_the_same_innocent_out_on_both_targets(
        runs: Callable[..., Pair]) -> None:
    """``real-wrong-blame``: the repair shop (the core's) blames the same
    healthy member for the killed one on both targets; its process is stopped
    and its host reports the exit, it is repaired and rejoins, then the
    rebooted culprit does; every sample is trained exactly once."""
    sc, sim, real, _ = runs("real-wrong-blame")
    blamed = []
    for history in (sim, real):
        (blame,) = [r for r in history if r["f"] == "fault" and r["kind"] == "blame"]
        innocent = blame["workers"][0]
        blamed.append(innocent)
        assert blame["culprit"] == 1 and innocent != 1, blame
        evicted = {(d["worker"], d["reason"]) for d in decisions(history) if d["kind"] == "evict"}
        assert evicted == {(1, "exited"), (innocent, "exited")}, evicted
        repairs = [(r["workers"], r["how"]) for r in history
                   if r["f"] == "fault" and r["kind"] == "repair"]
        assert repairs == [([innocent], "auto"), ([1], "misdiagnosed")], repairs
        gens = [r for r in history if r["f"] == "generation"]
        assert members_of(gens[-1]) == (0, 1, 2, 3), gens[-1]
        report = check(history, data_spec(sc))
        assert report.valid, report.violations
    assert blamed[0] == blamed[1]
