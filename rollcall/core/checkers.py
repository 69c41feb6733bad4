"""Invariant checkers that read only a history.

A run is valid when, from its ``history.jsonl`` alone, one can show:

- one member list per generation, and generations that only go up, at the
  keeper and at every worker;
- nothing committed or contributed by a worker outside the generation it was
  stamped with;
- every sample of the stream consumed exactly once along the *lineage*: the
  commits that survive every later resume point (a generation resuming from
  an earlier cursor discards the steps after it, which is lost work, not a
  duplicate);
- under ``batch: constant``, every committed step carried the global batch;
- where workers logged per-sample ledgers (``contribute``), the samples of
  each committed step are exactly those the data order prescribes, and only
  members contributed. A simulator at scale writes the compact form (one
  record per run of steps naming the generation's ``workers``: each, at its
  rank, contributed its shards of every step): there the check is that the
  workers are the members and their shards cover each committed step's
  batch exactly once, at the step's stream offsets; the dataset ids follow
  from the offsets by the data order, and each epoch is then consumed once
  because the lineage's offsets are contiguous (checked above).

The lineage is rebuilt per generation, so the checker does not depend on
the order in which processes' records were merged.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from rollcall.core.history import expand_deltas
from rollcall.core.idset import IdRuns
from rollcall.core.types import Cursor


@dataclass(frozen=True)
class DataSpec:
    seed: int
    dataset_samples: int
    global_batch: int
    micro_batch: int
    batch_policy: str = "constant"
    steps_target: int = 0


@dataclass
class CheckReport:
    valid: bool = True
    violations: list[str] = field(default_factory=list)
    steps_committed: int = 0
    samples_consumed: int = 0
    samples_duplicated: int = 0
    samples_skipped: int = 0
    global_batch_min: int = 0
    global_batch_max: int = 0
    generations: int = 0
    restarts: int = 0
    lost_steps: int = 0
    # sharded state (``recovery`` records): checkpoint fallbacks, peer bytes
    fallbacks: int = 0
    state_bytes_moved: int = 0
    steps_lost_to_fallback: int = 0
    lineage: list[dict] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.valid = False
        if len(self.violations) < 100:  # enough to debug, bounded for huge runs
            self.violations.append(message)


def _ids(runs: Any) -> IdRuns:
    """A record's member list as a set (an expanded delta is one already)."""
    return runs if isinstance(runs, IdRuns) else IdRuns(runs)


@dataclass
class _Gen:
    members: IdRuns
    cursor: Cursor
    commits: dict[int, dict] = field(default_factory=dict)  # first step -> record
    committers: set = field(default_factory=set)  # processes found to be members


def check(records: Iterable[dict], spec: DataSpec) -> CheckReport:
    """Check a whole history; see the module docstring for what is checked."""
    report = CheckReport()
    gens: dict[int, _Gen] = {}
    order: list[int] = []
    entered: dict[Any, int] = {}
    contributions: dict[tuple[int, int], list[dict]] = defaultdict(list)
    compact: dict[int, list[dict]] = defaultdict(list)  # gen -> compact ledger records
    pending_enters: list[dict] = []
    pending_commits: list[dict] = []
    for r in expand_deltas(records, lists=False):
        f = r.get("f")
        if f == "generation" and r.get("type") == "ok":
            _generation(report, gens, order, r)
        elif f == "enter":
            pending_enters.append(r)
        elif f == "commit":
            pending_commits.append(r)
        elif f == "contribute":
            if "workers" in r:
                compact[r["gen"]].append(r)
            else:
                contributions[(r["gen"], r["step"])].append(r)
        elif f == "restart":
            report.restarts += 1
        elif f == "recovery":
            _recovery(report, r)
    report.generations = len(order)
    for r in pending_enters:
        _enter(report, gens, entered, r)
    for r in pending_commits:
        _commit(report, gens, r)
    _lineage(report, gens, order, spec)
    if contributions or compact:
        _ledger(report, gens, contributions, compact, spec)
    report.valid = report.valid and not report.violations
    return report


def _generation(report: CheckReport, gens: dict[int, _Gen], order: list[int], r: dict) -> None:
    g = r["gen"]
    members = _ids(r["members"])
    if order and g <= order[-1]:
        report.fail(f"keeper generations not monotonic: {g} after {order[-1]}")
    if g in gens:
        if gens[g].members != members:
            report.fail(f"generation {g} has two member lists")
        return
    gens[g] = _Gen(members, Cursor.from_json(r["cursor"]))
    order.append(g)


def _recovery(report: CheckReport, r: dict) -> None:
    """Tally a sharded-state recovery; a fallback must not claim peer copies."""
    report.state_bytes_moved += r["bytes_moved"]
    if r["fallback"]:
        report.fallbacks += 1
        report.steps_lost_to_fallback += r["steps_lost"]
        if r["copies"] or not r["lost"]:
            report.fail(f"generation {r['gen']} fell back to the checkpoint with "
                        f"{r['copies']} peer copies and lost shards {r['lost']}")


def _enter(report: CheckReport, gens: dict[int, _Gen], entered: dict[Any, int], r: dict) -> None:
    w, g = r["process"], r["gen"]
    known = gens.get(g)
    if known is None:
        report.fail(f"worker {w} entered generation {g}, which the keeper never formed")
    elif _ids(r["members"]) != known.members:
        report.fail(f"worker {w} saw another member list for generation {g}")
    elif w not in known.members:
        report.fail(f"worker {w} entered generation {g} without being a member")
    life = (w, r.get("incarnation"))  # each life goes forward; an older one may wake late
    last = entered.get(life)
    if last is not None and g <= last:
        report.fail(f"worker {w} went from generation {last} to {g}")
    entered[life] = g


def _commit(report: CheckReport, gens: dict[int, _Gen], r: dict) -> None:
    g = r["gen"]
    gen = gens.get(g)
    if gen is None:
        report.fail(f"commit of step {r['step']} in unknown generation {g}")
        return
    p = r["process"]
    if isinstance(p, int) and p not in gen.committers:  # a generation's commits have few voters
        if p not in gen.members:
            report.fail(f"worker {p} committed step {r['step']} in generation {g} as a non-member")
            return
        gen.committers.add(p)
    seen = gen.commits.get(r["step"])
    if seen is None:
        gen.commits[r["step"]] = r
    elif (seen["last"], seen["sample"], seen["stop"], seen["batch"]) != (
            r["last"], r["sample"], r["stop"], r["batch"]):
        report.fail(f"two different commits of step {r['step']} in generation {g}")


def _lineage(report: CheckReport, gens: dict[int, _Gen], order: list[int], spec: DataSpec) -> None:
    """Walk generations in order; each resume point cuts the lineage."""
    lineage: list[dict] = []

    def end() -> Cursor:
        return Cursor(lineage[-1]["last"] + 1, lineage[-1]["stop"]) if lineage else Cursor()

    for g in order:
        gen = gens[g]
        start = gen.cursor
        while lineage and lineage[-1]["last"] >= start.step:
            cut = lineage.pop()
            if cut["step"] < start.step:  # keep the part before the resume point
                kept = start.step - cut["step"]
                lineage.append(dict(cut, last=start.step - 1,
                                    stop=cut["sample"] + kept * cut["batch"]))
            report.lost_steps += cut["last"] - max(cut["step"], start.step) + 1
        pos = end()
        if start != pos:
            if start.step > pos.step:
                report.samples_skipped += max(0, start.sample - pos.sample)
            report.fail(f"generation {g} resumes at {start.to_json()} but the lineage "
                        f"ends at {pos.to_json()}")
            pos = start
        for first in sorted(gen.commits):
            c = gen.commits[first]
            if first < pos.step or c["sample"] < pos.sample:
                report.samples_duplicated += max(0, min(c["stop"], pos.sample) - c["sample"])
                report.fail(f"generation {g} commits step {first} again (at {pos.to_json()})")
                continue
            if first > pos.step or c["sample"] > pos.sample:
                report.samples_skipped += max(0, c["sample"] - pos.sample)
                report.fail(f"generation {g} skips from {pos.to_json()} to step {first}")
            lineage.append(c)
            pos = Cursor(c["last"] + 1, c["stop"])
    report.lineage = lineage
    final = end()
    report.steps_committed = final.step
    report.samples_consumed = final.sample
    batches = [c["batch"] for c in lineage]
    if batches:
        report.global_batch_min, report.global_batch_max = min(batches), max(batches)
    for c in lineage:
        steps = c["last"] - c["step"] + 1
        if c["stop"] - c["sample"] != steps * c["batch"]:
            report.fail(f"commit {c['step']}..{c['last']} covers {c['stop'] - c['sample']} "
                        f"samples, not {steps} x {c['batch']}")
        if spec.batch_policy == "constant" and c["batch"] != spec.global_batch:
            report.fail(f"step {c['step']} carried batch {c['batch']}, not the constant "
                        f"{spec.global_batch}")
        if c["batch"] % spec.micro_batch:
            report.fail(f"step {c['step']} batch {c['batch']} is not whole micro-batches")


def _ledger(report: CheckReport, gens: dict[int, _Gen],
            contributions: dict[tuple[int, int], list[dict]],
            compact: dict[int, list[dict]], spec: DataSpec) -> None:
    """Per-sample proof: committed steps hold exactly the prescribed samples."""
    for (g, step), recs in contributions.items():
        members = gens[g].members if g in gens else ()
        for r in recs:
            if r["process"] not in members:
                report.fail(f"worker {r['process']} contributed to step {step} of "
                            f"generation {g} as a non-member")
    usable = _compact_ledger(report, gens, compact, spec)
    for c in report.lineage:
        rs = usable.get(c["gen"])
        if rs and _proved(c, rs):
            continue
        steps = _unproved(report, c, rs) if rs else range(c["step"], c["last"] + 1)
        for step in steps:
            _step_ledger(report, c, step, contributions, spec)
    # Each lineage step trained on exactly its offsets' dataset ids, and the
    # lineage's offsets run from 0 without a gap or an overlap (_lineage):
    # so every epoch it completed was consumed exactly once.


def _proved(c: dict, rs: list[tuple[int, int, int, int]]) -> bool:
    """Whether one compact record proves all of lineage commit ``c``: the
    common case (a generation's record spans its commits), decided without
    walking :func:`_unproved`, which says the same and reports what is off."""
    first, batch = c["step"], c["batch"]
    i = bisect.bisect_right(rs, (first, math.inf)) - 1
    if i < 0:
        return False
    step, r_last, sample, r_batch = rs[i]
    return (c["last"] <= r_last and r_batch == batch
            and sample + (first - step) * batch == c["sample"])


def _unproved(report: CheckReport, c: dict, rs: list[tuple[int, int, int, int]]) -> Iterator[int]:
    """The steps of lineage commit ``c`` that no compact record of its
    generation proves (``rs``: the records' (step, last, sample, batch),
    sorted, disjoint); a record at other offsets than the commit's is a
    violation."""
    first, last, batch = c["step"], c["last"], c["batch"]
    pos = first
    i = max(0, bisect.bisect_right(rs, (first, math.inf)) - 1)
    for step, r_last, sample, r_batch in itertools.islice(rs, i, None):
        if step > last:
            break
        lo, hi = max(step, pos), min(r_last, last)
        if lo > hi:
            continue
        if r_batch != batch or sample + (lo - step) * batch != c["sample"] + (lo - first) * batch:
            report.fail(f"the ledger of steps {lo}..{hi} of generation {c['gen']} is not at "
                        f"the committed batch's offsets")
            continue
        yield from range(pos, lo)
        pos = hi + 1
    yield from range(pos, last + 1)


def _step_ledger(report: CheckReport, c: dict, step: int,
                 contributions: dict[tuple[int, int], list[dict]], spec: DataSpec) -> None:
    """One committed step against its per-sample contributions: the members
    trained on exactly the dataset ids of the step's stream offsets."""
    from rollcall.core.reshard import sample_ids

    g = c["gen"]
    lo = c["sample"] + (step - c["step"]) * c["batch"]
    want = sample_ids(spec.seed, spec.dataset_samples, lo, lo + c["batch"])
    got = [sid for r in contributions.get((g, step), ()) for sid in r["samples"]]
    if len(got) == len(want) and sorted(got) == sorted(want):
        return
    extra, missing = Counter(got) - Counter(want), Counter(want) - Counter(got)
    report.samples_duplicated += sum(extra.values())
    report.samples_skipped += sum(missing.values())
    report.fail(f"step {step} of generation {g}: ledger differs from the data "
                f"order ({sum(extra.values())} extra, {sum(missing.values())} missing)")


def _compact_ledger(report: CheckReport, gens: dict[int, _Gen], compact: dict[int, list[dict]],
                    spec: DataSpec) -> dict[int, list[tuple[int, int, int, int]]]:
    """Check the compact ledger records on their own; return, per
    generation, the sorted (step, last, sample, batch) of those that may
    prove lineage steps (:func:`_unproved` matches them to the commits).

    A record proves a lineage step when its workers are the generation's
    members, its shards split the step's batch in whole micro-batches that
    the ranks cover once, and its offsets are the step's. Cost: O(records +
    lineage commits), and O(members) once per (shards, members) shape.
    """
    shapes: dict[tuple[int, int], bool] = {}
    usable: dict[int, list[tuple[int, int, int, int]]] = {}  # gen -> (step, last, sample, batch)
    for g, rs in compact.items():
        rs = sorted(rs, key=lambda r: r["step"])
        for a, b in zip(rs, rs[1:]):
            if b["step"] <= a["last"]:
                report.fail(f"steps {b['step']}..{a['last']} of generation {g} are in the "
                            f"ledger twice")
        gen = gens.get(g)
        usable[g] = []
        n_members = len(gen.members) if gen is not None else 0
        for r in rs:
            if gen is None or _ids(r["workers"]) != gen.members:
                report.fail(f"the ledger of steps {r['step']}..{r['last']} of generation {g} "
                            f"names workers other than the members")
                continue
            shape = (r["shards"], n_members)
            if shape not in shapes:
                shapes[shape] = _ranks_cover(*shape)
            if not shapes[shape] or r["batch"] != r["shards"] * spec.micro_batch:
                report.fail(f"the ledger of steps {r['step']}..{r['last']} of generation {g} "
                            f"splits its batch into shards the ranks do not cover")
                continue
            usable[g].append((r["step"], r["last"], r["sample"], r["batch"]))
    return usable


def _ranks_cover(shards: int, members: int) -> bool:
    """Whether the ranks' shard ranges split ``0..shards`` in order, once each."""
    from rollcall.core.reshard import rank_range

    pos = 0
    for r in range(members):
        lo, hi = rank_range(shards, members, r)
        if lo != pos or hi < lo:
            return False
        pos = hi
    return pos == shards


def summarize_report(report: CheckReport) -> dict[str, Any]:
    """The summary.json keys that come from the checker."""
    return {
        "valid": report.valid,
        "violations": list(report.violations),
        "steps_committed": report.steps_committed,
        "samples_consumed": report.samples_consumed,
        "samples_duplicated": report.samples_duplicated,
        "samples_skipped": report.samples_skipped,
        "global_batch_min": report.global_batch_min,
        "global_batch_max": report.global_batch_max,
        "generations": report.generations,
        "restarts": report.restarts,
        "lost_steps": report.lost_steps,
        "fallbacks": report.fallbacks,
        "state_bytes_moved": report.state_bytes_moved,
        "steps_lost_to_fallback": report.steps_lost_to_fallback,
    }
