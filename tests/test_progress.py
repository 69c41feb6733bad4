"""When a job is not expected to finish (rollcall.core.progress), and the keeper acting on it."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall.core import (
    FAILED_ATTEMPTS_LIMIT, NOT_EXPECTED, RECOVERY_WINDOW, JobFailed, Join, Keeper, KeeperConfig,
    RestartJob, make_detector,
)
from rollcall.core.progress import ProgressWatch
from rollcall.core.record import record_from_data, record_to_data


def _recoveries(watch: ProgressWatch, outcomes: list[bool], every_s: float = 100.0,
                takes_s: float = 10.0, step: int = 0) -> list:
    """One recovery per outcome, ``every_s`` apart; a completed one commits
    ``step`` (not beyond the furthest) ``takes_s`` after it began."""
    verdicts = []
    for i, completed in enumerate(outcomes):
        verdicts.append(watch.recovery(i * every_s))
        if completed:
            watch.committed(i * every_s + takes_s, step)
    return verdicts


def test_recoveries_that_complete_never_end_the_job() -> None:
    watch = ProgressWatch(None)
    assert _recoveries(watch, [True] * 10 * RECOVERY_WINDOW) == [None] * 10 * RECOVERY_WINDOW


def test_recoveries_all_cut_short_end_the_job_once_a_window_is_measured() -> None:
    watch = ProgressWatch(None)
    verdicts = _recoveries(watch, [False] * (RECOVERY_WINDOW + 1))
    assert verdicts[:RECOVERY_WINDOW] == [None] * RECOVERY_WINDOW
    reason = verdicts[-1]
    assert reason is not None and reason.startswith(NOT_EXPECTED)
    assert "every 100 s" in reason and "none completed" in reason, reason


def test_the_limit_is_failed_attempts_per_completed_recovery() -> None:
    """With ``c`` completed of a window, the job ends once the others are at
    least FAILED_ATTEMPTS_LIMIT times ``c``."""
    for completed in range(0, 6):
        watch = ProgressWatch(None)
        outcomes = [True] * completed + [False] * (RECOVERY_WINDOW - completed)
        verdicts = _recoveries(watch, outcomes + [False])
        cut_short = RECOVERY_WINDOW - completed
        expected = cut_short >= FAILED_ATTEMPTS_LIMIT * max(1, completed)
        assert (verdicts[-1] is not None) == expected, (completed, verdicts[-1])
        assert verdicts[:-1] == [None] * RECOVERY_WINDOW


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30).map(lambda n: n == 0),  # mostly cut short: near the limit
                min_size=RECOVERY_WINDOW, max_size=4 * RECOVERY_WINDOW))
def test_the_rate_rule_reads_the_latest_window_at_every_recovery(outcomes: list[bool]) -> None:
    """At each recovery the rule weighs exactly the latest RECOVERY_WINDOW
    that ended (the one before it ends now, cut short or committed): the
    window slides over completed and cut-short ones alike."""
    watch = ProgressWatch(None)
    for i, verdict in enumerate(_recoveries(watch, outcomes)):
        window = outcomes[max(0, i - RECOVERY_WINDOW):i]
        cut_short = window.count(False)
        expected = (len(window) == RECOVERY_WINDOW
                    and cut_short >= FAILED_ATTEMPTS_LIMIT * max(1, len(window) - cut_short))
        assert (verdict is not None) == expected, (i, window)


def test_no_progress_over_the_limit_of_recoveries_ends_the_job() -> None:
    """Recoveries that complete but only redo steps already committed once
    (rolled back to a checkpoint each time) make no progress."""
    watch = ProgressWatch(3)
    watch.committed(1.0, 40)  # the furthest step: 40
    verdicts = _recoveries(watch, [True] * 4, step=39)
    assert verdicts[:3] == [None] * 3
    assert verdicts[3] is not None and "beyond step 40" in verdicts[3], verdicts[3]
    watch = ProgressWatch(3)
    watch.committed(1.0, 40)
    assert _recoveries(watch, [True] * 3, step=39) == [None] * 3
    watch.committed(400.0, 41)  # progress: the count starts over
    assert _recoveries(watch, [True] * 3, step=40) == [None] * 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=300),
       st.one_of(st.none(), st.integers(1, 200)))
def test_a_verdict_is_never_given_before_the_job_has_been_measured(
        events: list[tuple[bool, int]], limit: int | None) -> None:
    """No verdict before a full window of recoveries, nor before ``limit``
    recoveries without progress; every verdict names the rule."""
    watch = ProgressWatch(limit)
    furthest, since = -1, 0
    for i, (completed, step) in enumerate(events):
        reason = watch.recovery(float(i))
        since += 1
        if reason is not None:
            assert reason.startswith(NOT_EXPECTED)
            assert i >= RECOVERY_WINDOW or (limit is not None and since > limit), (i, since)
            return
        if completed:
            watch.committed(i + 0.5, step)
            if step > furthest:
                furthest, since = step, 0


def _keeper(limit: int | None) -> Keeper:
    return Keeper(KeeperConfig(
        min_workers=2, max_workers=2, last_call_s=0.0, detector=make_detector("timeout", 0.5, 2.0),
        strategy="checkpoint-restart", max_recoveries_without_progress=limit))


def test_the_keeper_gives_up_a_checkpoint_restart_that_never_gets_further() -> None:
    """Each restart's relaunched group commits only steps it had committed
    before (its checkpoint is behind them): with a limit of 2 the third
    failure ends the job, with the history's ``round`` ``fail`` record."""
    k = _keeper(2)
    k.receive(0.0, Join(0, 0, None))
    k.receive(0.0, Join(1, 0, None))
    assert k.generation == 1
    assert k.commit(1.0, 0, 0, 1, 0, 9).ok  # steps 0..9: the furthest is 9
    outputs: list = []
    for attempt in range(1, 4):
        outputs = k.exited(10.0 * attempt, 1, attempt - 1)
        if attempt < 3:
            assert [o for o in outputs if isinstance(o, RestartJob)]
            k.receive(10.0 * attempt + 1, Join(0, attempt, None))
            k.receive(10.0 * attempt + 1, Join(1, attempt, None))
            assert k.commit(10.0 * attempt + 2, 0, attempt, k.generation, 0, 4).ok
    (failed,) = [o for o in outputs if isinstance(o, JobFailed)]
    assert failed.reason.startswith(NOT_EXPECTED) and "beyond step 9" in failed.reason
    assert not [o for o in outputs if isinstance(o, RestartJob)]


def test_the_count_without_progress_survives_a_keepers_failover() -> None:
    """The store's record carries the furthest step and the recoveries since
    it moved: a successor gives up at the same failure as its predecessor
    would have, not a whole limit of recoveries later."""
    k = _keeper(2)
    k.receive(0.0, Join(0, 0, None))
    k.receive(0.0, Join(1, 0, None))
    assert k.commit(1.0, 0, 0, 1, 0, 9).ok  # the furthest step: 9
    for attempt in (1, 2):  # two restarts that get no further
        assert [o for o in k.exited(10.0 * attempt, 1, attempt - 1) if isinstance(o, RestartJob)]
        k.receive(10.0 * attempt + 1, Join(0, attempt, None))
        k.receive(10.0 * attempt + 1, Join(1, attempt, None))
        assert k.commit(10.0 * attempt + 2, 0, attempt, k.generation, 0, 4).ok
    record = record_from_data(json.loads(json.dumps(record_to_data(k.durable_record("x")))))
    assert (record.furthest_step, record.recoveries_without_progress) == (9, 2)
    successor = Keeper.restored(k.config, record, term=1)
    successor.take_over(30.0, {0: 2, 1: 2})
    outputs = successor.exited(30.5, 1, 2)
    (failed,) = [o for o in outputs if isinstance(o, JobFailed)]
    assert failed.reason.startswith(NOT_EXPECTED) and "beyond step 9" in failed.reason


def test_a_round_below_min_workers_waits_only_while_a_worker_can_come() -> None:
    """join_timeout_s None: the keeper waits below min_workers while a worker
    can still arrive (arrivals_end_s), then a detection window and a last
    call more, and gives up as not expected to finish; with arrivals at any
    time (None) it waits on."""
    def starved(arrivals_end_s: float | None) -> tuple[Keeper, list]:
        k = Keeper(KeeperConfig(
            min_workers=2, max_workers=2, last_call_s=0.5, join_timeout_s=None,
            detector=make_detector("timeout", 0.5, 2.0), arrivals_end_s=arrivals_end_s))
        k.receive(0.0, Join(0, 0, None))
        k.receive(0.0, Join(1, 0, None))
        assert k.generation == 1
        return k, k.exited(1.0, 1, 0)  # below min_workers from t = 1
    k, out = starved(30.0)
    assert not [o for o in out if isinstance(o, JobFailed)]
    deadline = k.next_round_deadline()
    assert deadline == 30.0 + 2 * 2.0 + 0.5
    assert not [o for o in k.handle_timer(deadline - 0.01) if isinstance(o, JobFailed)]
    (failed,) = [o for o in k.handle_timer(deadline) if isinstance(o, JobFailed)]
    assert failed.reason.startswith(NOT_EXPECTED) and "below min_workers=2" in failed.reason
    assert "after t=30 s" in failed.reason
    k, _ = starved(None)
    assert k.next_round_deadline() is None and k.failed is None


def test_a_round_below_min_workers_waits_on_the_fleet_while_it_holds_enough_nodes() -> None:
    """fleet_returns: a starved round waits while the repair shop counts
    min_workers nodes in service or to come; once a retirement leaves fewer
    (Keeper.fleet_capacity), it gives up a detection window and a last call
    later. A scripted join that raises the count again keeps it waiting; a
    keeper that takes over is told the count in its report."""
    config = KeeperConfig(min_workers=2, max_workers=2, last_call_s=0.5, join_timeout_s=None,
                          detector=make_detector("timeout", 0.5, 2.0), arrivals_end_s=3.0,
                          fleet_returns=True)
    k = Keeper(config)
    k.receive(0.0, Join(0, 0, None))
    k.receive(0.0, Join(1, 0, None))
    k.node_down(1.0, 1)
    k.fleet_capacity(1.0, 2)  # node 1 in repair: it may come back
    assert not [o for o in k.exited(1.0, 1, 0) if isinstance(o, JobFailed)]
    assert k.next_round_deadline() is None, "a repair may bring a worker"
    k.fleet_capacity(50.0, 1)  # retired instead
    assert k.next_round_deadline() == 50.0 + 2 * 2.0 + 0.5
    k.fleet_capacity(52.0, 2)  # a node joins the fleet
    assert k.next_round_deadline() is None
    k.fleet_capacity(60.0, 1)
    deadline = k.next_round_deadline()
    assert deadline == 60.0 + 2 * 2.0 + 0.5
    assert not [o for o in k.handle_timer(deadline - 0.01) if isinstance(o, JobFailed)]
    (failed,) = [o for o in k.handle_timer(deadline) if isinstance(o, JobFailed)]
    assert failed.reason.startswith(NOT_EXPECTED) and "only 1 node in service or to come" in failed.reason

    successor = Keeper.restored(config, None, 1)
    successor.take_over(70.0, {0: 0, 1: 0}, down=[1], capacity=1)
    successor.receive(70.0, Join(0, 0, None))
    assert successor.round is not None
    assert successor.next_round_deadline() == 70.0 + 2 * 2.0 + 0.5
