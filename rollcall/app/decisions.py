"""The decisions a run made, read from its history alone (Jepsen-style).

Both targets run the same core, so on one scenario the sim and the real
target must decide the same things ("conformance"). What a run
decided is read here from its ``history.jsonl`` records only (the format is
:mod:`rollcall.core.history`), never from the code that wrote them, so the
sequence can be compared across targets, runs and versions:

- ``generation``  the keeper formed one: gen, members, cursor, source, stale, reason
- ``evict``       the keeper declared a life dead: worker, incarnation, reason
- ``restart``     the keeper ordered a whole-job restart of gen: gen, reason
- ``relaunch``    the lives that restart starts: gen, workers (the members
                  of gen it does not leave out), incarnations (``[[life, id
                  runs], ...]``; None where the record lists no lives, over
                  ``RELAUNCH_LISTED_MAX`` workers)
- ``give-up``     the keeper failed the job (a ``round`` fail): gen, reason
- ``end``         the job's outcome: completed, cursor (the wording of the
                  driver's ``reason`` is the driver's, not a decision)

Member lists and id sets stay id runs (``[[lo, hi], ...]``, merged where
adjacent), so a 10^5-worker history costs its runs, not its ids.
Evictions heard between two other decisions are facts of one moment (two
exits a millisecond apart, two timeouts at one instant), not an order, so
they are sorted by (worker, incarnation). Faults are the nemesis's, not the
keeper's: :func:`kills` reads them separately.

:func:`first_difference` names the first decision and field where two
sequences differ; :func:`mask` and :func:`drop` take out what a comparison
must not compare (a field the scenario does not determine), visibly.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

__all__ = ["KILL_KINDS", "NOT_COMPARED", "Decision", "decisions", "drop", "first_difference",
           "kills", "mask"]

Decision = dict[str, Any]  # "kind" plus the kind's fields, JSON values
NOT_COMPARED = "<not compared>"
# fault kinds that end a worker's process: a scripted kill, a rack (both
# reported by the host's exit notice), a random lifetime's end (``crash``:
# the machine's, noticed by the detector), the same names on both targets
KILL_KINDS = ("kill", "kill_rack", "lose_host", "crash")


def _runs(runs: Iterable[Sequence[int]]) -> list[list[int]]:
    """Inclusive id runs, adjacent ones merged: one set, one spelling."""
    out: list[list[int]] = []
    for lo, hi in runs:
        assert lo <= hi and (not out or lo > out[-1][1]), "runs increasing and disjoint"
        if out and lo == out[-1][1] + 1:
            out[-1][1] = hi
        else:
            out.append([lo, hi])
    return out


def _minus(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """The ids of runs ``a`` not in runs ``b`` (both sorted), as runs."""
    out: list[list[int]] = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] < lo:
            j += 1
        k = j
        while k < len(b) and b[k][0] <= hi:
            if lo < b[k][0]:
                out.append([lo, b[k][0] - 1])
            lo = max(lo, b[k][1] + 1)
            k += 1
        if lo <= hi:
            out.append([lo, hi])
    return out


def _by_life(workers: list[list[int]], common: int,
             others: Sequence[Sequence[int]]) -> list[list[Any]]:
    """A relaunch's lives as ``[[life, id runs], ...]``, lowest life first:
    one spelling of one map, however the record split it."""
    listed = sorted((w, life) for w, life in others if life != common)
    groups: dict[int, list[list[int]]] = {}
    for w, life in listed:
        groups.setdefault(life, []).append([w, w])
    out = {life: _runs(ws) for life, ws in groups.items()}
    rest = _minus(workers, _runs([w, w] for w, _ in listed))
    assert sum(hi - lo + 1 for lo, hi in rest) + len(listed) == \
        sum(hi - lo + 1 for lo, hi in workers), "a relaunch lists lives of its workers only"
    if rest:
        out[common] = rest
    return [[life, out[life]] for life in sorted(out)]


def _relaunch(r: dict, members: list[list[int]]) -> Decision:
    """Who a relaunch starts: the members of its generation it does not leave out."""
    workers = _minus(members, _runs(r["not_relaunched"]))
    lives = None if r["others"] is None else _by_life(workers, r["incarnation"], r["others"])
    return {"kind": "relaunch", "gen": r["gen"], "workers": workers, "incarnations": lives}


def _decision(r: dict, members: dict[int, list[list[int]]]) -> Optional[Decision]:
    """The decision one record states, or None for any other record;
    ``members`` maps each generation read so far to its member runs."""
    f, type_, process = r.get("f"), r.get("type"), r.get("process")
    if f == "end":
        return {"kind": "end", "completed": r["completed"], "cursor": list(r["cursor"])}
    if process != "keeper":
        return None
    if f == "generation" and type_ == "ok":
        members[r["gen"]] = _runs(r["members"])
        return {"kind": "generation", "gen": r["gen"], "members": members[r["gen"]],
                "cursor": list(r["cursor"]), "source": r["source"], "stale": r["stale"],
                "reason": r["reason"]}
    if f == "evict":
        return {"kind": "evict", "worker": r["worker"], "incarnation": r["incarnation"],
                "reason": r["reason"]}
    if f == "restart":
        return {"kind": "restart", "gen": r["gen"], "reason": r["reason"]}
    if f == "relaunch":
        assert r["gen"] in members, "a relaunch follows its generation"
        return _relaunch(r, members[r["gen"]])
    if f == "round" and type_ == "fail":
        return {"kind": "give-up", "gen": r["gen"], "reason": r["reason"]}
    return None


def decisions(history: Iterable[dict]) -> list[Decision]:
    """The run's decisions in history order (see the module docstring)."""
    out: list[Decision] = []
    evicts: list[Decision] = []
    members: dict[int, list[list[int]]] = {}
    for r in history:
        d = _decision(r, members)
        if d is None:
            continue
        if d["kind"] == "evict":
            evicts.append(d)
            continue
        out += sorted(evicts, key=lambda e: (e["worker"], e["incarnation"]))
        evicts = []
        out.append(d)
    out += sorted(evicts, key=lambda e: (e["worker"], e["incarnation"]))
    return out


def kills(history: Iterable[dict]) -> list[int]:
    """The workers the kill faults hit, in history order (the nemesis's
    ``fault`` records of a kind in :data:`KILL_KINDS`). Flat: one fault that
    hits two workers is one real record ``[1, 2]`` and two sim records."""
    return [w for r in history
            if r.get("f") == "fault" and r.get("kind") in KILL_KINDS for w in r["workers"]]


def mask(ds: Sequence[Decision], kind: str, fields: Sequence[str],
         when: Callable[[Decision], bool] = lambda d: True) -> list[Decision]:
    """``ds`` with ``fields`` of each ``kind`` decision that ``when`` picks
    replaced by :data:`NOT_COMPARED` (kept visible in a printed diff)."""
    out = []
    for d in ds:
        if d["kind"] == kind and when(d):
            assert set(fields) <= set(d), (fields, d)
            d = {k: (NOT_COMPARED if k in fields else v) for k, v in d.items()}
        out.append(d)
    return out


def drop(ds: Sequence[Decision], kind: str,
         when: Callable[[Decision], bool] = lambda d: True) -> list[Decision]:
    """``ds`` without the ``kind`` decisions that ``when`` picks."""
    return [d for d in ds if not (d["kind"] == kind and when(d))]


def first_difference(a: Sequence[Decision], b: Sequence[Decision],
                     names: tuple[str, str] = ("sim", "real")) -> Optional[str]:
    """None when the sequences are equal; else one line naming the first
    differing decision (by index and kind) and field, then both decisions."""
    na, nb = names
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        fields = ["kind"] + [k for k in x if k != "kind"] + [k for k in y if k not in x]
        field = next(k for k in fields if x.get(k) != y.get(k))
        return (f"decision {i} ({x['kind']}): {field}: {na} {x.get(field)!r} != "
                f"{nb} {y.get(field)!r}\n  {na}:  {x}\n  {nb}: {y}")
    if len(a) == len(b):
        return None
    longer, name = (a, na) if len(a) > len(b) else (b, nb)
    return (f"decision {min(len(a), len(b))}: {na} has {len(a)} decisions, {nb} {len(b)}; "
            f"the first extra ({name}): {longer[min(len(a), len(b))]}")
