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
  each committed step are exactly those the data order prescribes.

The lineage is rebuilt per generation, so the checker does not depend on
the order in which processes' records were merged.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from rollcall.core.types import Cursor, RunSet


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


@dataclass
class _Gen:
    members: RunSet
    cursor: Cursor
    commits: dict[int, dict] = field(default_factory=dict)  # first step -> record


def check(records: Iterable[dict], spec: DataSpec) -> CheckReport:
    """Check a whole history; see the module docstring for what is checked."""
    report = CheckReport()
    gens: dict[int, _Gen] = {}
    order: list[int] = []
    entered: dict[Any, int] = {}
    contributions: dict[tuple[int, int], list[dict]] = defaultdict(list)
    pending_enters: list[dict] = []
    pending_commits: list[dict] = []
    for r in records:
        f = r.get("f")
        if f == "generation" and r.get("type") == "ok":
            _generation(report, gens, order, r)
        elif f == "enter":
            pending_enters.append(r)
        elif f == "commit":
            pending_commits.append(r)
        elif f == "contribute":
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
    if contributions:
        _ledger(report, gens, contributions, spec)
    report.valid = report.valid and not report.violations
    return report


def _generation(report: CheckReport, gens: dict[int, _Gen], order: list[int], r: dict) -> None:
    g = r["gen"]
    members = RunSet(r["members"])
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
    elif RunSet(r["members"]) != known.members:
        report.fail(f"worker {w} saw another member list for generation {g}")
    elif w not in known.members:
        report.fail(f"worker {w} entered generation {g} without being a member")
    last = entered.get(w)
    if last is not None and g <= last:
        report.fail(f"worker {w} went from generation {last} to {g}")
    entered[w] = g


def _commit(report: CheckReport, gens: dict[int, _Gen], r: dict) -> None:
    g = r["gen"]
    gen = gens.get(g)
    if gen is None:
        report.fail(f"commit of step {r['step']} in unknown generation {g}")
        return
    p = r["process"]
    if isinstance(p, int) and p not in gen.members:
        report.fail(f"worker {p} committed step {r['step']} in generation {g} as a non-member")
        return
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
            contributions: dict[tuple[int, int], list[dict]], spec: DataSpec) -> None:
    """Per-sample proof: committed steps hold exactly the prescribed samples."""
    from rollcall.core.reshard import sample_ids

    for (g, step), recs in contributions.items():
        members = gens[g].members if g in gens else ()
        for r in recs:
            if r["process"] not in members:
                report.fail(f"worker {r['process']} contributed to step {step} of "
                            f"generation {g} as a non-member")
    n = spec.dataset_samples
    per_epoch: dict[int, Counter] = defaultdict(Counter)
    for c in report.lineage:
        g = c["gen"]
        for step in range(c["step"], c["last"] + 1):
            lo = c["sample"] + (step - c["step"]) * c["batch"]
            ids = sample_ids(spec.seed, n, lo, lo + c["batch"])
            want = Counter(ids)
            got: Counter = Counter()
            for r in contributions.get((g, step), ()):
                got.update(r["samples"])
            extra, missing = got - want, want - got
            if extra or missing:
                report.samples_duplicated += sum(extra.values())
                report.samples_skipped += sum(missing.values())
                report.fail(f"step {step} of generation {g}: ledger differs from the data "
                            f"order ({sum(extra.values())} extra, {sum(missing.values())} missing)")
            offsets: dict[int, list[int]] = defaultdict(list)
            for q, sid in zip(range(lo, lo + c["batch"]), ids):
                offsets[sid].append(q)
            for sid, k in got.items():  # what was really trained on, by epoch
                for _ in range(k):
                    q = offsets[sid].pop(0) if offsets[sid] else lo
                    per_epoch[q // n][sid] += 1
    last_full = report.samples_consumed // n
    for epoch in range(last_full):
        counts = per_epoch.get(epoch, Counter())
        if len(counts) != n or any(v != 1 for v in counts.values()):
            report.fail(f"epoch {epoch} not consumed exactly once")


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
