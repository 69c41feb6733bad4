"""Which sim histories a change alters: a digest of each, this tree against another (not a test).

    .venv/bin/python benchmarks/history_digests.py                     # print this tree's digests
    .venv/bin/python benchmarks/history_digests.py --against 6dbbc3b   # and list what differs

Runs every shipped scenario (``scenarios/*.yaml``, on the sim, as each
strategy) and every scenario of the fuzzer's fixed corpus
(``tests/data/fuzz-corpus/*.yaml``, as written) once, and prints the first
16 hex digits of the SHA-256 of each ``history.jsonl``. With ``--against
REV`` the same runs are made from a ``git archive`` of REV in a child
process, and every run whose history differs (or that only one tree can
run) is listed: the check behind "sim histories stay byte-identical
wherever semantics do not change". ``gpu100k-30d`` is left out by default
(a minute per strategy); ``--all`` takes it in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from sim_scale import archive

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("checkpoint-restart", "elastic")
SLOW = ("gpu100k-30d",)


def runs(root: Path, everything: bool) -> list[tuple[str, Path, str | None]]:
    """(name, scenario file, strategy or None: the file's own) for every run of ``root``'s tree."""
    out: list[tuple[str, Path, str | None]] = []
    for path in sorted((root / "scenarios").glob("*.yaml")):
        if path.stem in SLOW and not everything:
            continue
        out += [(f"{path.stem}/{strategy}", path, strategy) for strategy in STRATEGIES]
    for path in sorted((root / "tests" / "data" / "fuzz-corpus").glob("*.yaml")):
        out.append((f"fuzz-corpus/{path.stem}", path, None))
    return out


def digests(root: Path, everything: bool) -> dict[str, str]:
    """Each run's history digest in ``root``'s tree (run in this process: call from a child)."""
    sys.path.insert(0, str(root))
    from rollcall.scenario import load_scenario
    from sim.driver import run

    out: dict[str, str] = {}
    for name, path, strategy in runs(root, everything):
        try:
            scenario = load_scenario(path, target="sim", strategy=strategy)
        except Exception as exc:  # a file this tree refuses: said, not fatal
            out[name] = f"refused: {str(exc)[:100]}"
            continue
        with tempfile.TemporaryDirectory(prefix="digest-") as tmp:
            try:
                run(scenario, tmp)
            except Exception as exc:  # a crash is a result here, the thing to list
                out[name] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"
                continue
            out[name] = hashlib.sha256((Path(tmp) / "history.jsonl").read_bytes()).hexdigest()[:16]
    return out


def _child(root: Path, everything: bool) -> dict[str, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(root)]
    if everything:
        cmd.append("--all")
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"history_digests: the run in {root} failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV", help="compare with git revision REV")
    ap.add_argument("--all", action="store_true", help="take the slow scenarios in too")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(digests(args.child, args.all)))
        return 0
    mine = _child(ROOT, args.all)
    if not args.against:
        for name, digest in mine.items():
            print(f"{digest:<18} {name}")
        return 0
    with tempfile.TemporaryDirectory(prefix="digests-") as tmp:
        base = archive(args.against, Path(tmp) / "base")
        if base is None:
            return 2
        # the corpus of this tree, run by the other tree's code too
        corpus = ROOT / "tests" / "data" / "fuzz-corpus"
        if corpus.is_dir():
            subprocess.run(["cp", "-r", str(corpus), str(base / "tests" / "data")], check=True)
        theirs = _child(base, args.all)
    changed = [name for name in mine if mine[name] != theirs.get(name)]
    only_theirs = [name for name in theirs if name not in mine]
    for name in changed:
        print(f"changed  {name}: {theirs.get(name, '(not run)')} -> {mine[name]}")
    for name in only_theirs:
        print(f"gone     {name}: {theirs[name]}")
    print(f"{len(mine) - len(changed)} of {len(mine)} histories identical to {args.against}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
