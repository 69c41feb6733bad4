"""Unit tests of the record-keeper's decisions, without any network.

Like torchft's quorum tests: the decision is a pure state machine, so each
rule is shown by feeding messages and reading the outputs.
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from rollcall.core.detector import TimeoutDetector, Verdict
from rollcall.core.keeper import (
    Broadcast, Formed, JobFailed, Keeper, KeeperConfig, Record, RestartJob, Send,
)
from rollcall.core.messages import (
    Checkpointed, Heartbeat, Join, JoinBatch, Leave, Membership, Refused, RollCall, StepFailed,
)
from rollcall.core.types import Cursor


def keeper(n_max: int = 4, n_min: int = 2, strategy: str = "elastic",
           join_timeout_s: float | None = None, last_call_s: float = 0.5) -> Keeper:
    return Keeper(KeeperConfig(min_workers=n_min, max_workers=n_max, last_call_s=last_call_s,
                               detector=TimeoutDetector(0.5, 3.0), strategy=strategy,
                               join_timeout_s=join_timeout_s))


def formed(outputs: list) -> list[Formed]:
    return [o for o in outputs if isinstance(o, Formed)]


def start(k: Keeper, n: int, cursor: Cursor | None = None) -> Formed:
    out = []
    for w in range(n):
        out += k.receive(0.0, Join(w, 0, cursor))
    out += k.handle_timer(1.0)
    (f,) = formed(out)
    return f


def test_first_generation_waits_for_last_call_then_closes() -> None:
    k = keeper(n_max=4)
    assert not formed(k.receive(0.0, Join(0, 0, None)))
    assert not formed(k.receive(0.1, Join(1, 0, None)))  # min reached: last call opens
    assert k.get_timer() == 0.6
    out = k.handle_timer(0.6)
    (f,) = formed(out)
    assert f.generation == 1 and tuple(f.members) == (0, 1)


def test_round_closes_at_once_when_full() -> None:
    k = keeper(n_max=2)
    k.receive(0.0, Join(0, 0, None))
    (f,) = formed(k.receive(0.0, Join(1, 0, None)))
    assert tuple(f.members) == (0, 1)


def test_extra_joiners_wait_as_standby_and_replace_the_dead() -> None:
    k = keeper(n_max=2)
    k.receive(0.0, Join(0, 0, None))
    k.receive(0.0, Join(1, 0, None))
    k.receive(0.0, Join(2, 0, None))  # a spare: no room
    assert tuple(k.members) == (0, 1) and 2 in k.standby
    k.receive(1.0, Join(0, 0, Cursor(5, 40), generation=1))  # stays a member: rejoin
    out = k.exited(1.0, 1, 0)
    out += k.receive(1.0, JoinBatch((0,), Cursor(5, 40)))
    out += k.handle_timer(2.0)
    f = formed(out)[-1]
    assert tuple(f.members) == (0, 2) and f.source == 0 and tuple(f.stale) == (2,)


def test_detector_evicts_silent_member_and_survivors_resume_at_the_most_advanced_state() -> None:
    k = keeper()
    start(k, 3)
    for t in (1.0, 2.0, 3.0):
        for w in (0, 1):
            k.receive(t, Heartbeat(w, 0, 1, int(t)))
    out = k.handle_timer(4.0)  # worker 2 silent since 1.0 (its join): dead at 4.0
    calls = [o for o in out if isinstance(o, Broadcast) and isinstance(o.message, RollCall)]
    assert calls and tuple(calls[0].to) == (0, 1)
    out = k.receive(4.1, Join(0, 0, Cursor(7, 56), 1))
    out += k.receive(4.1, Join(1, 0, Cursor(6, 48), 1))
    (f,) = formed(out)
    assert tuple(f.members) == (0, 1) and f.cursor == Cursor(7, 56) and f.source == 0 and tuple(f.stale) == (1,)


def test_the_bulk_form_of_heartbeats_leaves_only_the_silent_on_the_timer() -> None:
    """A simulator says which workers beat on time instead of sending their
    beats: the keeper's timer then names a silent worker's expiry only, and
    its verdicts are the ones the beats would have given: the worker silent
    since its last beat is dead one timeout later, one left out of a later
    statement was last seen at the one before, and a heartbeat brings a
    silent worker back."""
    def evicted(out: list) -> list[int]:
        return [o.record["worker"] for o in out
                if isinstance(o, Record) and o.record["f"] == "evict"]

    k = keeper()
    start(k, 4)
    k.observe_beating_except(1.0, [])
    assert k.get_timer() is None  # everyone beats on time: nothing is due
    k.observe_silent(2.5, [2])  # its last beat reached the keeper at 2.5
    assert k.get_timer() == 5.5
    k.observe_beating_except(3.0, [2, 3])  # 3 fell silent after the statement at 1.0
    assert k.get_timer() == 4.0
    assert evicted(k.handle_timer(3.9)) == []
    assert evicted(k.handle_timer(4.0)) == [3]
    k.receive(5.2, Heartbeat(2, 0, 1, 9))  # on time again
    k.observe_beating_except(5.3, [3])
    assert evicted(k.handle_timer(5.5)) == [] and 2 in k.members


def test_slow_member_is_waited_for_until_the_detector_says_dead() -> None:
    k = keeper()
    start(k, 3)
    k.receive(1.0, Heartbeat(2, 0, 1, 1))  # worker 2 last heard at 1.0, then stalls
    k.receive(1.0, StepFailed(0, 0, 1, 3))  # a peer looks gone: roll call
    k.receive(1.1, Join(0, 0, Cursor(3, 24), 1))
    k.receive(1.1, Join(1, 0, Cursor(3, 24), 1))
    assert k.round is not None and set(k.round.expected) == {2}  # not evicted by the round
    k.receive(2.0, Heartbeat(0, 0, 1, 1))
    k.receive(2.0, Heartbeat(1, 0, 1, 1))
    assert not formed(k.handle_timer(3.9))
    out = k.handle_timer(4.0)
    (f,) = formed(out)
    assert tuple(f.members) == (0, 1)


def test_evicted_worker_is_refused_then_rejoins_as_newcomer() -> None:
    k = keeper()
    start(k, 3)
    for w in (0, 1):
        k.receive(3.5, Heartbeat(w, 0, 1, 1))
    k.handle_timer(4.0)
    k.receive(4.1, JoinBatch((0, 1), Cursor(2, 16), None, 1))
    assert k.generation == 2 and tuple(k.members) == (0, 1)
    out = k.receive(9.0, Heartbeat(2, 0, 1, 7))  # wakes up, stamped with generation 1
    (refusal,) = [o.message for o in out if isinstance(o, Send)]
    assert refusal == Refused(2, 0, 2, "not-member")
    out = k.receive(9.1, Join(2, 0, Cursor(1, 8), 1))
    assert [o for o in out if isinstance(o, Broadcast) and isinstance(o.message, RollCall)]
    k.receive(9.2, JoinBatch((0, 1), Cursor(4, 32), None, 2))
    (f,) = formed(k.handle_timer(9.7))
    assert tuple(f.members) == (0, 1, 2) and f.source == 0 and tuple(f.stale) == (2,)


def test_stale_incarnation_is_fenced() -> None:
    k = keeper()
    start(k, 2)
    k.receive(1.0, Join(1, 1, None))  # worker 1 restarted: its old life is over
    out = k.receive(1.1, Heartbeat(1, 0, 1, 9))
    assert any(isinstance(o, Send) and o.message.reason == "stale-incarnation" for o in out)


def test_stale_generation_report_is_refused() -> None:
    k = keeper()
    start(k, 3)
    k.exited(1.0, 2, 0)
    k.receive(1.1, JoinBatch((0, 1), Cursor(1, 8)))
    assert k.generation == 2
    out = k.receive(1.2, StepFailed(0, 0, 1, 0))  # delayed report about generation 1
    assert any(isinstance(o, Send) and o.message.reason == "stale-generation" for o in out)
    assert k.round is None


def test_membership_is_resent_to_a_member_that_missed_it() -> None:
    k = keeper()
    start(k, 2)
    out = k.receive(1.0, Heartbeat(1, 0, 0, 1))  # still stamped generation 0
    (msg,) = [o.message for o in out if isinstance(o, Send)]
    assert isinstance(msg, Membership) and msg.generation == 1 and msg.admits(1, 0)


def test_below_minimum_gives_up_after_join_timeout() -> None:
    k = keeper(join_timeout_s=10.0)
    start(k, 2)
    out = k.exited(2.0, 1, 0)
    assert not [o for o in out if isinstance(o, JobFailed)]
    assert k.get_timer() <= 12.0
    out = k.handle_timer(12.0)
    assert [o for o in out if isinstance(o, JobFailed)] and k.failed


def test_leave_opens_a_round_without_the_leaver() -> None:
    k = keeper()
    start(k, 3)
    k.receive(1.0, Leave(2, 0))
    (f,) = formed(k.receive(1.1, JoinBatch((0, 1), Cursor(3, 24))))
    assert tuple(f.members) == (0, 1) and f.reason == "leave"


def test_checkpoint_restart_relaunches_and_resumes_from_checkpoint() -> None:
    k = keeper(strategy="checkpoint-restart")
    start(k, 3)
    k.receive(1.0, Checkpointed(0, 0, 1, Cursor(50, 400)))
    out = k.exited(2.0, 1, 0)
    assert [o for o in out if isinstance(o, RestartJob)]
    out = k.receive(2.5, Heartbeat(0, 0, 1, 5))  # old lives are fenced
    assert any(isinstance(o, Send) and o.message.reason == "stale-incarnation" for o in out)
    out = []
    for w in range(3):
        out += k.receive(40.0, Join(w, 1, None))
    out += k.handle_timer(40.5)  # new lives all: a last call for more of them
    (f,) = formed(out)
    assert tuple(f.members) == (0, 1, 2) and f.cursor == Cursor(50, 400) and f.source is None
    assert tuple(f.stale) == (0, 1, 2)


def test_detector_verdicts() -> None:
    d = TimeoutDetector(0.5, 3.0)
    assert d.verdict(10.0, 9.9) is Verdict.ALIVE
    assert d.verdict(10.0, 8.9) is Verdict.SUSPECT
    assert d.verdict(10.0, 7.0) is Verdict.DEAD
    # the simulator's shortcut agrees with the live path
    assert d.detection_time(10.2, 0.1, 0.01) == d.expiry(10.1 + 0.01)


@given(order=st.permutations(list(range(6))), cursor=st.integers(0, 5))
def test_join_batch_equals_individual_joins(order: list[int], cursor: int) -> None:
    """A batch answer is exactly the answers one by one, in any order."""
    def run(batch: bool) -> Formed:
        k = keeper(n_max=6, n_min=1)
        start(k, 6)
        k.exited(1.0, order[0], 0)
        survivors = tuple(order[1:])
        c = Cursor(cursor, cursor * 8)
        if batch:
            out = k.receive(1.1, JoinBatch(survivors, c))
        else:
            out = k.receive_many(1.1, [Join(w, 0, c, 1) for w in survivors])
        (f,) = formed(out)
        return f

    assert run(True) == run(False)


def test_state_of_an_abandoned_branch_is_not_resumed() -> None:
    """A worker evicted holding step 200 must not drag the job back onto its
    branch after a later generation resumed from a checkpoint at step 175."""
    k = keeper(n_max=3, n_min=1)
    k.receive(0.0, Join(0, 0, None))
    k.receive(0.0, Join(1, 0, None))
    k.handle_timer(0.5)                                       # generation 1 = (0, 1)
    k.receive(1.0, Checkpointed(0, 0, 1, Cursor(175, 1400)))
    k.receive(2.0, Heartbeat(0, 0, 1, 1))
    k.handle_timer(3.0)                                       # 1 (paused) evicted
    (f,) = formed(k.receive(3.0, Join(0, 0, Cursor(200, 1600), 1)))
    assert tuple(f.members) == (0,) and f.cursor == Cursor(200, 1600)
    k.exited(4.0, 0, 0)                                       # the last holder dies
    out = k.receive(5.0, Join(2, 0, None))                    # a newcomer, no state
    out += k.handle_timer(5.5)
    assert formed(out)[-1].cursor == Cursor(175, 1400)        # back to the checkpoint
    out = k.receive(6.0, Join(1, 0, Cursor(200, 1600), generation=1))  # 1 wakes up
    out += k.receive(6.0, JoinBatch((2,), Cursor(176, 1408)))
    out += k.handle_timer(6.5)
    f = formed(out)[-1]
    assert f.cursor == Cursor(176, 1408) and f.source == 2 and tuple(f.stale) == (1,)


def test_a_life_that_left_never_joins_again() -> None:
    """Regression (stateful test, seed 1533859732): a copy of a Join (or a
    worker in a batch) from a life that left arrived in a later round and
    the keeper admitted it as a newcomer. A Leave ends that life for good;
    only a newer life of the worker may join."""
    k = keeper(n_max=4, n_min=1)
    start(k, 3)
    k.receive(1.0, Leave(2, 0))  # worker 2 leaves; round 2 forms of 0 and 1
    k.receive_many(1.0, [Join(0, 0, Cursor(), 1), Join(1, 0, Cursor(), 1)])
    assert tuple(k.members) == (0, 1)
    for late in ([Join(2, 0, None, 1)], [JoinBatch((1, 2), None)]):
        k.receive(2.0, StepFailed(0, 0, k.generation, 0))  # a round is open
        out = k.receive_many(2.0, [*late, Join(0, 0, Cursor(), k.generation)])
        out += k.receive(2.0, Join(1, 0, Cursor(), k.generation)) + k.handle_timer(3.0)
        assert 2 not in k.members, late
        assert any(isinstance(o, Send) and isinstance(o.message, Refused) and o.to == 2
                   for o in out), late
    assert k.node_up(5.0, 2) == 1  # a repaired machine's new life may
    g = k.generation
    k.receive_many(5.0, [Join(2, 1, None), Join(0, 0, Cursor(), g), Join(1, 0, Cursor(), g)])
    k.handle_timer(6.0)
    assert 2 in k.members and k.incarnation_of(2) == 1
