"""History records: the one format both targets write to ``history.jsonl``.

Jepsen-style: each record is an operation by a ``process`` with a ``type``
(``invoke`` when it starts, ``ok`` when it took effect, ``fail`` when it
surely did not, ``info`` for facts and faults) and a function name ``f``.
Checkers read only these records, never the code that wrote them.

Records used (``f``, who writes it, fields beyond t/type/f/process):

- ``round``     keeper  invoke  gen, reason              a roll call opened
- ``round``     keeper  fail    gen, reason              the job gave up (below minimum)
- ``generation`` keeper ok      gen, members, cursor, source, reason, stale
- ``recovery``  keeper  info    gen, initial, fallback, lost, copies, reloads,
                                 bytes_moved, bytes_reloaded, steps_lost
                                 sharded state only, right after ``generation``:
                                 ``initial`` a fresh placement (first generation,
                                 checkpoint-restart); else the plan's peer copies
                                 and checkpoint reloads (counts and bytes), the
                                 lost shards (id runs) and whether it fell back to
                                 the checkpoint, throwing ``steps_lost`` committed
                                 steps away
- ``evict``     keeper  info    worker, incarnation, reason
- ``refuse``    keeper  info    worker, what, reason      a stale stamp refused
- ``restart``   keeper  info    gen, reason               whole-job restart ordered
- ``relaunch``  keeper  info    gen, not_relaunched, incarnation, others
                                 the lives a restart of ``gen`` starts (the
                                 keeper's ``Relaunch``): every member of ``gen``
                                 but the id runs ``not_relaunched`` (their node
                                 is down), each at life ``incarnation`` except
                                 the ``[worker, life]`` pairs of ``others`` (by
                                 id); ``others`` null: not listed (over 1024
                                 workers, ``keeper.RELAUNCH_LISTED_MAX``); no
                                 record when nobody is relaunched
- ``checkpoint`` any    ok      gen, cursor               a durable checkpoint
- ``enter``     worker  ok      gen, incarnation, members  a life entered a generation
- ``abort``     worker  fail    gen, reason                in-flight step abandoned
- ``fenced``    worker  info    gen, reason                learned it was evicted / stale
- ``commit``    any     ok      gen, step, last, sample, stop, batch, t0
                                 steps ``step..last`` committed in ``gen``,
                                 covering stream offsets ``[sample, stop)``
- ``contribute`` worker ok      gen, step, samples         per-sample ledger (real)
- ``fault``     nemesis info    kind, workers              injected fault (kind: kill, crash,
                                 kill_rack (+ rack), lose_host (+ host), partition (+ hosts,
                                 for_s), isolate_keeper (+ host, for_s), delay (+ host, for_s,
                                 latency_s), loss (+ host, for_s, rate), heal (+ hosts: a cut or
                                 a link fault ended), pause (+ for_s), resume, repair, join)
- ``end``       driver  info    completed, cursor, reason

Member lists are written as inclusive id runs (see ``types.to_ranges``). A
``generation``'s ``members`` and a compact ``contribute``'s ``workers`` of more
than ``DELTA_MIN_RUNS`` runs are written as their change against the same
kind's previous record (``members_add``/``members_drop``,
``workers_add``/``workers_drop``) when that is shorter: a history's size
follows its events, not its job's size. :func:`expand_deltas` (which
``check`` and ``rollcall.results.read_history`` apply) restores the lists.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

from rollcall.core.idset import IdRuns
from rollcall.core.types import Cursor, WorkerId, from_ranges, to_ranges

KEEPER = "keeper"
NEMESIS = "nemesis"
DRIVER = "driver"
JOB = "job"


def rec(t: float, type_: str, f: str, process: Any, **fields: Any) -> dict:
    """One history record. Times are rounded so the JSON text is stable."""
    return {"t": round(t if t.__class__ is float else float(t), 9), "type": type_, "f": f,
            "process": process, **fields}


def members_field(members: Iterable[WorkerId]) -> list[list[int]]:
    runs = getattr(members, "runs", None)  # an IdRuns holds them already
    return runs() if callable(runs) else to_ranges(members)


# A member list of more runs than this is written as its change against the
# list the same kind of record wrote before (``<key>_add``, ``<key>_drop``):
# a 10^6-GPU job's generation records carried 20,000 runs each.
DELTA_MIN_RUNS = 64
_DELTA_KEYS = {"generation": "members", "contribute": "workers"}


def members_delta(key: str, members: IdRuns, before: Optional[IdRuns]) -> dict[str, Any]:
    """``{key: runs}``, or against ``before`` (the list the previous record
    of the kind wrote) ``{key_add: runs, key_drop: runs}`` when the list is
    long and the change is shorter; :func:`expand_deltas` restores ``key``."""
    n = members.run_count() if before is not None else 0
    if n > DELTA_MIN_RUNS:
        add, drop = members - before, before - members  # type: ignore[operator]
        # a set has no more runs than ids: the few ids a generation changes
        # settle it without counting the runs of two masks as wide as the job
        if len(add) + len(drop) < n or add.run_count() + drop.run_count() < n:
            return {f"{key}_add": add.runs(), f"{key}_drop": drop.runs()}
    return {key: members.runs()}


def expand_deltas(records: Iterable[dict], lists: bool = True) -> Iterator[dict]:
    """The records with every member-list delta (:func:`members_delta`)
    replaced by the whole list, as the record would have carried it: what
    every reader of a history sees. A record that holds the list passes as
    it is. ``lists=False`` puts an :class:`IdRuns` in place of every list
    (a delta's or a whole one) instead of its runs: a checker that only
    tests membership and equality derives no runs and builds each set once."""
    last: dict[str, IdRuns] = {}
    built: list[tuple[list, IdRuns]] = []  # the latest whole lists read (runs, set)
    for r in records:
        key = _DELTA_KEYS.get(r.get("f"))  # type: ignore[arg-type]
        if key is None or (key not in r and f"{key}_add" not in r):
            yield r
            continue
        if key in r:
            whole = _whole(r[key], built)
            last[r["f"]] = whole
            yield r if lists else {**r, key: whole}  # a set either way when asked: built once
            continue
        before = last.get(r["f"])
        assert before is not None, f"a {r['f']} delta with no list before it: {r}"
        now = (before | IdRuns(r[f"{key}_add"])) - IdRuns(r[f"{key}_drop"])
        last[r["f"]] = now
        out = {k: v for k, v in r.items() if k not in (f"{key}_add", f"{key}_drop")}
        out[key] = now.runs() if lists else now
        yield out


def _whole(runs: list, built: list[tuple[list, IdRuns]]) -> IdRuns:
    """The set of a whole member list, reusing one of the few read last (a
    generation's ledger records repeat its generation record's list)."""
    for seen, ids in built:
        if runs is seen or runs == seen:
            return ids
    ids = IdRuns(runs)
    built.insert(0, (runs, ids))
    del built[2:]
    return ids


def members_of(record: dict) -> tuple[WorkerId, ...]:
    return from_ranges(record["members"])


def cursor_of(record: dict) -> Cursor:
    return Cursor.from_json(record["cursor"])


def commit(
    t: float, process: Any, gen: int, first: int, last: int,
    sample: int, stop: int, batch: int, t0: float,
) -> dict:
    """Steps ``first..last`` (inclusive) committed in ``gen`` between t0 and t."""
    return rec(t, "ok", "commit", process, gen=gen, step=first, last=last,
               sample=sample, stop=stop, batch=batch, t0=round(float(t0), 9))


class FailureTally:
    """The summary's ``failures``, one definition for both targets, read from
    the history's ``fault`` and ``evict`` records as they are written.

    A failure is a worker a fault took out: each worker a ``kill``,
    ``crash``, ``kill_rack`` or ``lose_host`` record lists (the targets list only the
    nodes that were up), and a paused worker only if the pause cost it its
    membership: the keeper evicted it for silence (``timeout``) before it
    resumed (a partition's far side likewise, until it heals; a delayed or
    lossy link's workers likewise, until it heals). A pause the
    job rode out is a slow worker, not a failure; a
    paused worker killed meanwhile counts once, for the kill.
    """

    __slots__ = ("count", "_paused")

    _KILLS = frozenset(("kill", "crash", "kill_rack", "lose_host"))

    def __init__(self) -> None:
        self.count = 0
        self._paused: set[WorkerId] = set()  # paused and not yet evicted for it

    def feed(self, record: dict) -> None:
        """One history record (any: those other than faults and evictions pass)."""
        f = record.get("f")
        if f == "fault":
            kind, workers = record.get("kind"), record.get("workers", ())
            if kind in self._KILLS:
                self.count += len(workers)
                self._paused.difference_update(workers)
            elif kind in ("pause", "partition", "isolate_keeper", "delay", "loss"):  # if evicted
                self._paused.update(workers)
            elif kind in ("resume", "heal"):
                self._paused.difference_update(workers)
        elif f == "evict" and record.get("reason") == "timeout":
            w = record.get("worker")
            if w in self._paused:
                self._paused.discard(w)
                self.count += 1

    @classmethod
    def of(cls, records: Iterable[dict]) -> int:
        tally = cls()
        for r in records:
            tally.feed(r)
        return tally.count
