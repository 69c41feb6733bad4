"""The thorough scenario fuzz of the sim: 10^4 drawn scenarios and more.

Each scenario is drawn over the whole schema and run on the sim with the
checks of ``tests/scenario_fuzz.py`` (a named end, a valid history, metrics
in range, and for one run in ``--twice-every`` the same history from the
same seed). The draws are split into chunks, each a hypothesis search of
its own seed (``--seed`` + chunk index), run over ``--jobs`` processes.

Prints the count run, the count of each end reason, the failures by
signature (first seed and example, the saved scenarios and the command that
replays each), the most events a run took, the slowest run (its scenario in
``runs/fuzz-slowest.yaml``) and the wall time; exits 1 when a failure was
reported. ``--ignore REGEX`` leaves known signatures
out of the failures (counted apart), so a run finds the distinct ones;
``--shrink`` searches each new signature again from its chunk's seed and
lets hypothesis shrink it, saving the smallest scenario beside the first.

``--write-corpus`` instead draws scenarios from a fixed seed, keeps small,
fast, passing ones that together cover the most features, and writes 40 of
them to ``tests/data/fuzz-corpus/`` (the corpus test runs each). The same
tree writes the same files; hypothesis also draws from the constants of the
project's modules, so another tree may draw others: the files, once
written, are the corpus.

    .venv/bin/python benchmarks/fuzz_sim.py --count 10000 --jobs 2
    .venv/bin/python benchmarks/fuzz_sim.py --write-corpus
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import scenario_fuzz as fuzz  # noqa: E402

CORPUS_SEED = 20_240_611  # the corpus is drawn from this seed
CORPUS_SIZE = 40
CORPUS_CANDIDATES = 1500
CORPUS_MAX_EVENTS = 20_000  # a corpus scenario's run: small and fast (a count, not a time,
# so the corpus is the same whatever the machine's load)
SAVED_PER_SIGNATURE = 3  # failing scenarios written per signature
SLOWEST = ROOT / "runs" / "fuzz-slowest.yaml"


@dataclass
class Found:
    """One failing example: its signature, what went wrong, where its chunk's search starts."""

    signature: str
    message: str
    text: str
    chunk_seed: int
    chunk_examples: int  # the chunk's max_examples (hypothesis sizes its search by it)
    example: int  # its place in the chunk's search (1-based)


@dataclass
class ChunkResult:
    chunk_seed: int
    ran: int = 0
    ends: Counter = field(default_factory=Counter)
    found: list[Found] = field(default_factory=list)
    slowest_s: float = 0.0
    slowest_text: str = ""
    most_events: int = 0  # in one run (simpy's count of events scheduled)
    most_instant_events: int = 0  # stepped at one simulated instant, in one run


def _quiet_settings(examples: int, phases: tuple[Phase, ...] = (Phase.generate,)) -> settings:
    return settings(max_examples=examples, phases=phases, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=False,
                    report_multiple_bugs=False)


def _start_worker() -> None:
    # every module imported, in each worker as in this process (where --shrink
    # searches again), so a chunk's seed draws the same cases in both
    fuzz.import_project_modules()


def fuzz_chunk(chunk_seed: int, examples: int, twice_every: int) -> ChunkResult:
    """Run ``examples`` drawn cases of one chunk; record every failure, raise none."""
    result = ChunkResult(chunk_seed)

    @seed(chunk_seed)
    @_quiet_settings(examples)
    @given(fuzz.fuzz_cases(twice_every=twice_every))
    def run(case: fuzz.FuzzCase) -> None:
        result.ran += 1
        started = time.perf_counter()
        outcome = fuzz.run_case(case)
        took = time.perf_counter() - started
        if took > result.slowest_s:
            result.slowest_s, result.slowest_text = took, case.text
        result.most_instant_events = max(result.most_instant_events, outcome.instant_events)
        if outcome.summary is not None:
            result.most_events = max(result.most_events, outcome.summary["events"])
        result.ends[outcome.end_reason] += 1
        if not outcome.ok:
            result.found.append(Found(outcome.signature, outcome.describe(), case.text,
                                      chunk_seed, examples, result.ran))

    run()
    return result


def shrink(found: Found, twice_every: int) -> str | None:
    """The chunk's search again, failing only on ``found``'s signature, so
    hypothesis finds that example again and shrinks it; its smallest text."""
    smallest: list[str] = []

    @seed(found.chunk_seed)
    @_quiet_settings(found.chunk_examples, (Phase.generate, Phase.shrink))
    @given(fuzz.fuzz_cases(twice_every=twice_every))
    def search(case: fuzz.FuzzCase) -> None:
        outcome = fuzz.run_case(case)
        if outcome.signature == found.signature:
            smallest[:] = [case.text]
            raise fuzz.failure_type(found.signature)(outcome.describe())

    try:
        search()
    except fuzz.FuzzFailure:
        return smallest[0] if smallest else None
    except Exception as exc:  # noqa: BLE001 - e.g. hypothesis's Flaky: reported, not shrunk
        print(f"    not shrunk: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return None
    return None  # not found again: the search went otherwise


def _run_chunks(args: argparse.Namespace) -> list[ChunkResult]:
    chunks = max(1, -(-args.count // args.chunk))
    sizes = [args.chunk] * (chunks - 1) + [args.count - args.chunk * (chunks - 1)]
    results = []
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, initializer=_start_worker) as pool:
        futures = [pool.submit(fuzz_chunk, args.seed + i, n, args.twice_every)
                   for i, n in enumerate(sizes)]
        for future in as_completed(futures):
            results.append(future.result())
            ran = sum(r.ran for r in results)
            bad = sum(len(r.found) for r in results)
            print(f"  {len(results)}/{chunks} chunks, {ran} scenarios, {bad} failing, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    return sorted(results, key=lambda r: r.chunk_seed)


def _report(args: argparse.Namespace, results: list[ChunkResult], wall_s: float) -> int:
    ends = sum((r.ends for r in results), Counter())
    print(f"\nran {sum(r.ran for r in results)} scenarios in {wall_s:.0f} s wall "
          f"({args.jobs} processes, seeds {args.seed}..{args.seed + len(results) - 1}); "
          f"slowest run {max(r.slowest_s for r in results):.2f} s; most events in a run "
          f"{max(r.most_events for r in results)}, at one instant "
          f"{max(r.most_instant_events for r in results)} (bounds {fuzz.TOTAL_EVENTS}, "
          f"{fuzz.SAME_INSTANT_EVENTS})")
    slowest = max(results, key=lambda r: r.slowest_s)
    SLOWEST.parent.mkdir(parents=True, exist_ok=True)
    SLOWEST.write_text(f"# the slowest run of the fuzz: {slowest.slowest_s:.2f} s\n"
                       + slowest.slowest_text)
    print(f"the slowest run's scenario: {SLOWEST.relative_to(ROOT)}")
    print("ends:")
    for reason, count in ends.most_common():
        print(f"  {count:6d}  {reason}")
    found = [f for r in results for f in r.found]
    ignored = [f for f in found if any(re.search(p, f.signature) for p in args.ignore)]
    new = [f for f in found if f not in ignored]
    if ignored:
        print(f"ignored (known): {len(ignored)} failures, "
              f"{len({f.signature for f in ignored})} signatures")
    by_signature: dict[str, list[Found]] = {}
    for f in new:
        by_signature.setdefault(f.signature, []).append(f)
    print(f"failures: {len(new)} in {len(by_signature)} signatures")
    for signature, items in by_signature.items():
        first = items[0]
        paths = [fuzz.save_failure(f.text, fuzz.Outcome(None, [(signature, f.message)]))
                 for f in items[:SAVED_PER_SIGNATURE]]
        print(f"- {signature}: {len(items)}x\n    {first.message}\n    chunk seed "
              f"{first.chunk_seed}, example {first.example}")
        for path in paths:
            print(f"    replay: {fuzz.replay_command(path)}")
        if args.shrink:
            small = shrink(first, args.twice_every)
            if small is not None:
                outcome = fuzz.Outcome(None, [(signature, first.message)])
                smallest = fuzz.save_failure(small, outcome)
                print(f"    shrunk: {fuzz.replay_command(smallest)}")
    return 1 if new else 0


def write_corpus(directory: Path) -> int:
    """Draw from :data:`CORPUS_SEED`, keep passing scenarios small and fast
    enough, pick greedily those that add the most features, write them."""
    candidates: list[tuple[fuzz.FuzzCase, set[str]]] = []

    @seed(CORPUS_SEED)
    @_quiet_settings(CORPUS_CANDIDATES)
    @given(fuzz.fuzz_cases())
    def draw(case: fuzz.FuzzCase) -> None:
        sc = case.scenario
        if sc.cluster.workers > 1000 or sc.workload.steps > 120:
            return
        outcome = fuzz.run_case(case)
        if outcome.ok and outcome.summary["events"] <= CORPUS_MAX_EVENTS:
            candidates.append((case, fuzz.features(case)))

    draw()
    chosen: list[tuple[fuzz.FuzzCase, set[str]]] = []
    covered: Counter = Counter()

    def score(candidate: tuple[fuzz.FuzzCase, set[str]]) -> tuple[float, int]:
        # a feature counts less each time it is covered again: first every
        # feature once, then the rarest ones again; shorter files win ties
        return sum(1 / (1 + covered[f]) ** 2 for f in candidate[1]), -len(candidate[0].text)

    while candidates and len(chosen) < CORPUS_SIZE:
        best = max(candidates, key=score)
        candidates.remove(best)
        chosen.append(best)
        covered.update(best[1])
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    for i, (case, features) in enumerate(chosen):
        faults = sorted({f.action for f in case.scenario.failures.schedule})
        name = "-".join([f"{i:02d}", case.scenario.strategy.kind] + faults)[:80]
        header = (f"# drawn by benchmarks/fuzz_sim.py --write-corpus (seed {CORPUS_SEED});\n"
                  f"# faults: {', '.join(faults) or 'none scheduled'}\n")
        (directory / f"{name}.yaml").write_text(header + case.text)
    missing = sorted(fuzz.expected_features() - set(covered))
    print(f"wrote {len(chosen)} scenarios to {directory} from {CORPUS_CANDIDATES} drawn; "
          f"features not covered: {missing}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="scenarios to run")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--seed", type=int, default=None, help="first chunk's seed (random)")
    parser.add_argument("--chunk", type=int, default=500, help="scenarios per chunk")
    parser.add_argument("--twice-every", type=int, default=2,
                        help="one run in this many is made twice and the histories compared")
    parser.add_argument("--ignore", action="append", default=[], metavar="REGEX",
                        help="leave failures whose signature matches out of the report")
    parser.add_argument("--shrink", action="store_true", help="shrink each new signature")
    parser.add_argument("--write-corpus", action="store_true",
                        help=f"write the corpus to {fuzz.CORPUS_DIR.relative_to(ROOT)} and stop")
    args = parser.parse_args(argv)
    if args.write_corpus:
        _start_worker()
        return write_corpus(fuzz.CORPUS_DIR)
    if args.count < 1 or args.jobs < 1 or args.chunk < 1 or args.twice_every < 1:
        parser.error("--count, --jobs, --chunk and --twice-every are >= 1")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    print(f"fuzzing {args.count} scenarios, seed {args.seed} "
          f"(replay: {sys.argv[0]} --seed {args.seed} --count {args.count} "
          f"--chunk {args.chunk} --twice-every {args.twice_every})", flush=True)
    started = time.perf_counter()
    results = _run_chunks(args)
    return _report(args, results, time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main())
