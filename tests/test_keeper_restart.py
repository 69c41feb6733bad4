"""The keeper's restart, relaunch and commit decisions, without any network.

Who is relaunched after a checkpoint-restart, as which life, and whether a
step counts are decided here and nowhere else; both drivers only carry the
answers out. Each rule is shown by feeding facts and reading the outputs.
"""

from __future__ import annotations

from rollcall.core import (
    EMPTY, Formed, IdRuns, JobFailed, JobPolicy, Join, JoinBatch, Keeper, KeeperConfig, Record, Relaunch,
    RestartJob,
    StepFailed, TimeoutDetector,
)
from rollcall.core.keeper import RELAUNCH_LISTED_MAX


def keeper(n_max: int = 3, steps: int = 10,
           strategy: str = "checkpoint-restart", restart_failure: str = "repeat",
           max_restarts: int | None = None) -> Keeper:
    return Keeper(KeeperConfig(min_workers=1, max_workers=n_max, last_call_s=0.5,
                               detector=TimeoutDetector(0.5, 3.0), strategy=strategy,
                               relaunch_timeout_s=20.0,
                               policy=JobPolicy(steps=steps, checkpoint_interval_steps=5),
                               restart_failure=restart_failure, max_restarts=max_restarts))


def start(k: Keeper, n: int) -> None:
    out = k.receive_many(0.0, [Join(w, 0, None) for w in range(n)])
    out += k.handle_timer(1.0)
    assert [o for o in out if isinstance(o, Formed)]


def of(out: list, kind: type) -> list:
    return [o for o in out if isinstance(o, kind)]


def relaunch_records(out: list) -> list[dict]:
    """The history's account of each Relaunch (what a checker can read)."""
    return [{k: o.record[k] for k in ("gen", "not_relaunched", "incarnation", "others")}
            for o in of(out, Record) if o.record["f"] == "relaunch"]


def test_a_lost_node_is_not_relaunched_whichever_report_comes_first() -> None:
    for first in ("exit", "step-failed"):
        k = keeper()
        start(k, 3)
        k.node_down(2.0, 2)  # the machine is gone: heard before anything else
        if first == "exit":
            out = k.exited(2.1, 2, 0)
        else:
            out = k.receive(2.1, StepFailed(0, 0, 1, 4))
        (restart,) = of(out, RestartJob)
        assert tuple(restart.teardown) == (0, 1, 2)  # every member process goes
        (relaunch,) = of(out, Relaunch)
        assert relaunch.lives() == {0: 1, 1: 1}, first
        assert relaunch_records(out) == [{"gen": 1, "not_relaunched": [[2, 2]],
                                          "incarnation": 1, "others": []}], first


def test_a_crashed_process_on_a_healthy_node_is_relaunched() -> None:
    k = keeper()
    start(k, 3)
    (relaunch,) = of(k.exited(2.0, 2, 0), Relaunch)
    assert relaunch.lives() == {0: 1, 1: 1, 2: 1}


def test_a_relaunched_node_lost_before_it_joins_is_waited_for_until_the_timeout() -> None:
    """``restart_failure: replace``: the keeper relaunches at once; a node
    lost while its new process starts never joins, and the round stops
    waiting for it at the relaunch timeout, then goes on without it."""
    k = keeper(restart_failure="replace")
    start(k, 3)
    out = k.exited(2.0, 2, 0)
    assert of(out, RestartJob)
    (relaunch,) = of(out, Relaunch)  # at once: the restart time is the processes'
    assert relaunch.lives() == {0: 1, 1: 1, 2: 1}
    k.node_down(10.0, 1)  # dies while its new process starts
    out = k.receive_many(20.1, [Join(0, 1, None), Join(2, 1, None)])
    out += k.handle_timer(20.6)
    assert not of(out, Formed)
    assert k.next_round_deadline() == 22.0  # the relaunch timeout, from the teardown
    out = k.handle_timer(22.0)
    assert [(o.record["worker"], o.record["reason"]) for o in of(out, Record)
            if o.record["f"] == "evict"] == [(1, "never-relaunched")]
    out += k.handle_timer(22.5)  # new lives only: the last call passes
    (f,) = of(out, Formed)
    assert tuple(f.members) == (0, 2)


def test_a_node_lost_during_the_restart_starts_it_over() -> None:
    """``restart_failure: repeat`` (the default): the loss is detected (the
    detector's silence after the node went down) and the restart starts
    over from there: every life it started is torn down and the others are
    relaunched as their next ones, without the lost node."""
    k = keeper()
    start(k, 3)
    k.exited(2.0, 2, 0)
    k.node_down(10.0, 1)
    assert k.next_round_deadline() == 13.0  # its silence, as the detector's
    out = k.handle_timer(13.0)
    (restart,) = of(out, RestartJob)
    assert restart.reason == "restart-failure" and tuple(restart.teardown) == (0, 1, 2)
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 2, 2: 2}


def test_a_relaunched_life_lost_before_the_job_resumes_fails_the_group() -> None:
    """A relaunched life that dies before the generation forms: every life
    the restart started is torn down and relaunched as its next one."""
    k = keeper()
    start(k, 3)
    (relaunch,) = of(k.exited(2.0, 2, 0), Relaunch)
    assert relaunch.lives() == {0: 1, 1: 1, 2: 1}
    k.receive(3.1, Join(0, 1, None))
    out = k.exited(3.2, 0, 1)  # before the others joined
    (restart,) = of(out, RestartJob)
    assert restart.reason == "restart-failure" and tuple(restart.teardown) == (0, 1, 2)
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 2, 1: 2, 2: 2}
    out = k.receive(4.3, JoinBatch(relaunch.workers, None, relaunch.incarnations))
    out += k.handle_timer(4.8)
    (f,) = of(out, Formed)
    assert tuple(f.members) == (0, 1, 2) and f.reason == "restart"


def test_the_relaunch_record_names_each_life_started() -> None:
    """A newcomer that joined the restart round is at its first life when
    the next restart relaunches it; the record groups the lives by value."""
    k = keeper(n_max=4)
    start(k, 3)
    k.node_down(2.0, 2)
    out = k.exited(2.0, 2, 0)
    (relaunch,) = of(out, Relaunch)
    out = k.receive_many(2.1, [JoinBatch(relaunch.workers, None, relaunch.incarnations),
                              Join(3, 0, None)])
    out += k.handle_timer(2.7)  # the newcomer's last call passes
    (f,) = of(out, Formed)
    assert tuple(f.members) == (0, 1, 3)
    out = k.exited(3.0, 0, 1)  # a crash on a healthy node: it is relaunched too
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 2, 1: 2, 3: 1}
    assert relaunch_records(out) == [{"gen": 2, "not_relaunched": [], "incarnation": 2,
                                      "others": [[3, 1]]}]


def test_a_large_relaunch_record_names_the_common_life_only() -> None:
    n = RELAUNCH_LISTED_MAX + 1
    k = keeper(n_max=n)
    start(k, n)
    out = k.exited(2.0, 0, 0)
    (relaunch,) = of(out, Relaunch)
    assert len(relaunch.workers) == n
    assert relaunch_records(out) == [{"gen": 1, "not_relaunched": [], "incarnation": 1,
                                      "others": None}]


def test_a_repaired_node_starts_as_a_life_never_handed_out_before() -> None:
    k = keeper()
    start(k, 3)
    k.node_down(1.0, 2)
    k.exited(1.0, 2, 0)  # restart: lives 0 -> 1 ordered; worker 2 is not relaunched
    assert k.node_up(5.0, 2) == 1  # the life ordered for it and never started
    assert k.node_up(6.0, 2) == 2  # asked again (its process died before joining)
    assert k.node_up(7.0, 0) == 2  # worker 0's life 1 was relaunched: the next one


def test_commit_vote() -> None:
    k = keeper(strategy="elastic", steps=2)
    start(k, 2)
    assert k.commit(1.0, 0, 0, 1, 0).reason == "ok" and k.commit(1.0, 0, 0, 1, 0).first is False
    assert k.commit(1.0, 1, 0, 1, 0).ok  # the same step from another member
    assert k.commit(1.0, 2, 0, 1, 1).reason == "stale-generation"  # not a member
    assert k.commit(1.0, 1, 1, 1, 1).reason == "stale-incarnation"
    assert k.commit(1.0, 1, 0, 0, 1).reason == "stale-generation"
    k.receive(2.0, StepFailed(1, 0, 1, 1))  # a roll call opens
    assert k.commit(2.0, 0, 0, 1, 1).reason == "round-open"
    assert k.commit(2.0, 1, 0, 1, 0).ok  # already committed: still applies
    assert not k.completed


def test_commit_of_the_last_step_completes_the_job() -> None:
    k = keeper(strategy="elastic", steps=2)
    start(k, 1)
    assert not k.commit(1.0, 0, 0, 1, 0).complete
    v = k.commit(1.1, 0, 0, 1, 1)
    assert v.ok and v.first and v.complete and k.completed


def test_a_life_a_restart_outdated_while_it_joined_is_refused() -> None:
    """Regression (stateful test, seed 2155524081): a new life's Join ends
    the old life, and under checkpoint-restart that ends the generation; the
    restart orders a life newer than the joiner's (it was handed out by
    node_up), so the joiner's Join must not then set the life table back."""
    k = keeper()
    start(k, 2)
    assert k.node_up(1.0, 0) == 1  # worker 0's process starts again as life 1 ...
    out = k.receive(1.0, Join(0, 1, None))  # ... and its Join ends life 0: a restart
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 2, 1: 1}  # never life 1 twice
    assert [o.record["reason"] for o in of(out, Record) if o.record["f"] == "refuse"] \
        == ["stale-incarnation"]
    assert k.incarnation_of(0) == 1 and k.node_up(2.0, 0) == 3  # life 2 is out there


def test_a_failed_restart_never_relaunches_a_life_node_up_handed_out() -> None:
    """Regression (stateful test, seed 2709111787): worker 1's node was lost
    and repaired during a restart; node_up handed out its ordered life 1, whose
    process was starting when the group failed. The new restart tears that
    life down too and relaunches life 2: never the same life twice."""
    k = keeper()
    start(k, 2)
    k.node_down(2.0, 1)
    # restart: worker 1's node is down, not relaunched
    (relaunch,) = of(k.exited(2.0, 1, 0), Relaunch)
    assert relaunch.lives() == {0: 1}
    assert k.node_up(3.0, 1) == 1  # repaired: its process starts as the ordered life
    k.receive(3.1, Join(0, 1, None))
    out = k.exited(3.2, 0, 1)
    (restart,) = of(out, RestartJob)
    assert tuple(restart.teardown) == (0, 1)
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 2, 1: 2}


def test_an_empty_teardown_leaves_a_large_relaunch_record_naming_the_members_life() -> None:
    """A restart that tears down nobody (the group's lives are all gone
    already: a failure during the restart) keeps the cohort, so the next
    restart's unlisted record still names the life its members are at. It
    named the cohort's base instead, 0 or a count of restarts: 461 of the
    471 records of llama3-54d under checkpoint-restart were wrong."""
    from rollcall.core.lives import LifeTable

    n = RELAUNCH_LISTED_MAX + 5
    everyone = IdRuns.span(0, n - 1)
    table = LifeTable()
    table.bump(everyone)
    table.bump(everyone - IdRuns.span(3, 3))  # worker 3 was lost: not relaunched
    table.bump(EMPTY)
    table.bump(everyone)
    lives = table.snapshot(everyone)
    assert {w: lives.of(w) for w in (0, 3, n - 1)} == {0: 3, 3: 2, n - 1: 3}
    assert lives.common_and_others(RELAUNCH_LISTED_MAX) == (3, None)
    assert lives.common_and_others() == (3, [(3, 2)])


def test_max_restarts_counts_every_restart_and_then_the_job_gives_up() -> None:
    """torchrun's --max-restarts: a restart that starts over after a loss in
    the restarting group counts too; past the budget the keeper orders no
    restart but a JobFailed, with the history's ``round`` ``fail`` record,
    and decides nothing after it."""
    k = keeper(max_restarts=2)
    start(k, 3)
    assert of(k.exited(2.0, 2, 0), RestartJob)  # 1
    k.node_down(10.0, 1)
    out = k.handle_timer(13.0)
    assert of(out, RestartJob)  # 2: the restart starts over
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 2, 2: 2}
    k.receive(13.1, Join(0, 2, None))
    out = k.exited(13.2, 0, 2)  # a third loss: no third restart
    assert not of(out, RestartJob) and not of(out, Relaunch)
    (failed,) = of(out, JobFailed)
    assert failed.reason.startswith("max_restarts=2 reached")
    (record,) = [o.record for o in of(out, Record) if o.record["f"] == "round"]
    assert record["type"] == "fail" and record["reason"] == failed.reason
    assert k.failed == failed.reason
    assert not of(k.handle_timer(100.0), Formed)


def test_max_restarts_zero_gives_up_at_the_first_failure_and_none_never() -> None:
    k = keeper(max_restarts=0)
    start(k, 3)
    out = k.exited(2.0, 2, 0)
    assert of(out, JobFailed) and not of(out, RestartJob)
    k = keeper()
    start(k, 3)
    for i in range(5):  # no budget: restarts go on
        out = k.exited(2.0 + 10 * i, 2, i)
        assert of(out, RestartJob) and not of(out, JobFailed)
        (relaunch,) = of(out, Relaunch)  # no restart delay: at once
        out = k.receive(2.1 + 10 * i, JoinBatch(relaunch.workers, None, relaunch.incarnations))
        out += k.handle_timer(2.7 + 10 * i)
        assert of(out, Formed)


def test_members_silent_in_one_tick_cost_one_restart() -> None:
    """Regression: a partition
    silences workers 1 and 2 together, and the detector's verdicts come in
    one tick. The first restarts the job and tears every member down; the
    second life's verdict was then read as a loss in the restarting group,
    a second restart at the same instant (one more against max_restarts,
    and that worker's next life named twice over by the later relaunch)."""
    k = keeper(max_restarts=1)
    start(k, 3)
    k.observe_alive(3.5, [0])  # only worker 0 is heard from
    out = k.handle_timer(4.0)
    evicted = [o.record["worker"] for o in of(out, Record) if o.record["f"] == "evict"]
    assert evicted == [1]  # the restart ended worker 2's life before its verdict
    assert len(of(out, RestartJob)) == 1 and not of(out, JobFailed)
    (relaunch,) = of(out, Relaunch)
    assert relaunch.lives() == {0: 1, 1: 1, 2: 1}


def test_a_node_repaired_during_the_restart_starts_a_life_after_the_relaunched_one() -> None:
    """A restart relaunches node 2 as life 1; the node fails and is repaired
    before that process joined, and node_up hands the repaired node's
    process the next life: never the same life twice. Its Join replaces the
    relaunched life the round waited for."""
    k = keeper(restart_failure="replace")
    start(k, 3)
    (relaunch,) = of(k.exited(2.0, 1, 0), Relaunch)
    assert relaunch.lives() == {0: 1, 1: 1, 2: 1}
    k.node_down(5.0, 2)
    life = k.node_up(6.0, 2)
    assert life == 2
    out = k.receive_many(8.1, [Join(0, 1, None), Join(1, 1, None), Join(2, life, None)])
    out += k.handle_timer(9.0)
    (formed,) = of(out, Formed)
    assert tuple(formed.members) == (0, 1, 2)
    assert k.incarnation_of(2) == 2
