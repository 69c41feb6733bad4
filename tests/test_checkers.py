"""The history checkers: each invariant accepts a good history and names the
first thing wrong with a bad one."""

from __future__ import annotations

from rollcall.core.checkers import DataSpec, check
from rollcall.core.history import commit, rec
from rollcall.core.reshard import sample_ids
from rollcall.core.types import to_ranges

SPEC = DataSpec(seed=3, dataset_samples=40, global_batch=8, micro_batch=4,
                batch_policy="constant", steps_target=10)


def gen(t: float, g: int, members: list[int], step: int) -> dict:
    return rec(t, "ok", "generation", "keeper", gen=g, members=to_ranges(members),
               cursor=[step, step * 8], source=None, reason="test", stale=0)


def enter(t: float, w: int, g: int, members: list[int]) -> dict:
    return rec(t, "ok", "enter", w, gen=g, members=to_ranges(members))


def steps(t: float, g: int, first: int, last: int, process: object = "job") -> dict:
    return commit(t, process, g, first, last, first * 8, (last + 1) * 8, 8, t - 1)


def good() -> list[dict]:
    return [
        gen(0, 1, [0, 1, 2], 0), enter(0, 0, 1, [0, 1, 2]), enter(0, 1, 1, [0, 1, 2]),
        steps(5, 1, 0, 4),
        rec(6, "info", "evict", "keeper", worker=2, incarnation=0, reason="timeout"),
        gen(7, 2, [0, 1], 5), enter(7, 0, 2, [0, 1]),
        steps(9, 2, 5, 9),
    ]


def test_good_history_is_valid() -> None:
    report = check(good(), SPEC)
    assert report.valid, report.violations
    assert report.steps_committed == 10 and report.samples_consumed == 80
    assert report.samples_duplicated == report.samples_skipped == 0
    assert report.generations == 2
    assert (report.global_batch_min, report.global_batch_max) == (8, 8)


def test_rollback_is_lost_work_not_duplication() -> None:
    h = good()[:4] + [gen(7, 2, [0, 1], 2), steps(9, 2, 2, 9)]  # resume from a checkpoint at 2
    report = check(h, SPEC)
    assert report.valid, report.violations
    assert report.lost_steps == 3 and report.steps_committed == 10


def test_two_member_lists_for_one_generation() -> None:
    h = good() + [gen(10, 2, [0], 5)]
    assert any("two member lists" in v for v in check(h, SPEC).violations)


def test_generations_must_go_up() -> None:
    h = good() + [gen(10, 1, [0, 1, 2], 10)]
    assert not check(h, SPEC).valid


def test_worker_entering_with_another_view() -> None:
    h = good() + [enter(8, 1, 2, [0, 1, 2])]
    report = check(h, SPEC)
    assert any("another member list" in v for v in report.violations)


def test_worker_going_back_a_generation() -> None:
    h = good() + [enter(8, 0, 1, [0, 1, 2])]
    assert any("went from generation" in v for v in check(h, SPEC).violations)


def test_commit_by_non_member() -> None:
    h = good() + [steps(9, 2, 5, 9, process=2)]
    assert any("non-member" in v for v in check(h, SPEC).violations)


def test_skipped_steps() -> None:
    h = good()[:-1] + [steps(9, 2, 6, 9)]
    report = check(h, SPEC)
    assert not report.valid and report.samples_skipped == 8


def test_resume_past_the_lineage_is_a_skip() -> None:
    h = good()[:5] + [gen(7, 2, [0, 1], 6), steps(9, 2, 6, 9)]
    report = check(h, SPEC)
    assert not report.valid and report.samples_skipped == 8


def test_duplicated_steps() -> None:
    h = good() + [steps(10, 2, 9, 9)]
    assert not check(h, SPEC).valid


def test_constant_batch_enforced() -> None:
    h = good()[:3] + [commit(5, "job", 1, 0, 4, 0, 20, 4, 4)]
    assert any("constant" in v for v in check(h, SPEC).violations)


def ledger(t: float, w: int, g: int, step: int, ids: list[int]) -> dict:
    return rec(t, "ok", "contribute", w, gen=g, step=step, samples=ids)


def ledger_history(corrupt: bool = False) -> list[dict]:
    h = [gen(0, 1, [0, 1], 0)]
    for step in range(5):  # one epoch: 40 samples
        ids = sample_ids(SPEC.seed, 40, step * 8, step * 8 + 8)
        h.append(ledger(step + 0.5, 0, 1, step, ids[:4]))
        h.append(ledger(step + 0.5, 1, 1, step, ids[4:]))
        h.append(commit(step + 1, 0, 1, step, step, step * 8, step * 8 + 8, 8, step))
    if corrupt:
        h[1] = ledger(0.5, 0, 1, 0, [h[4]["samples"][0]] + h[1]["samples"][1:])
    return h


def test_ledger_proves_exactly_once() -> None:
    report = check(ledger_history(), SPEC)
    assert report.valid, report.violations


def test_ledger_catches_a_sample_trained_twice() -> None:
    report = check(ledger_history(corrupt=True), SPEC)
    assert not report.valid
    assert report.samples_duplicated == 1 and report.samples_skipped == 1
    assert any("ledger differs" in v for v in report.violations)


def test_ledger_contribution_from_non_member() -> None:
    h = ledger_history() + [ledger(9, 5, 1, 0, [1, 2])]
    assert any("non-member" in v for v in check(h, SPEC).violations)
