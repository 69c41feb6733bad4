"""Soak of the real target: many runs beside a CPU hog, faults or signals drawn at random (not a test).

    .venv/bin/python benchmarks/soak_real.py                        # the chaos scenario, 20 runs, one hog
    .venv/bin/python benchmarks/soak_real.py --runs 5 --hogs 0 scenarios/real-kill-one.yaml
    .venv/bin/python benchmarks/soak_real.py --faults --runs 20 --seed 7      # a drawn scenario per run
    .venv/bin/python benchmarks/soak_real.py --signals --runs 50 --seed 7     # SIGINT/SIGTERM at random
    .venv/bin/python benchmarks/soak_real.py --signals --faults --seed 7 --only 12   # replay one run

Three modes, combinable:

- plain: the same scenario file run N times; what varies is the timing the
  machine gives it (``--hogs`` busy-loop processes compete for the cores);
- ``--faults``: each run's scenario is drawn by a seeded generator
  (:func:`draw_scenario`: kills, pauses, host loss, partitions, keeper
  isolation, packet loss, keeper kills where etcd is installed), written as
  YAML beside the run directory;
- ``--signals``: each run gets SIGINT or SIGTERM at an instant drawn
  uniformly from the process's start to a little past a run's usual length
  (``--window-s``, measured by one unsignalled run when not given), sent to
  the launcher's process group (a terminal's Ctrl-C) or to the launcher
  alone (a scheduler's SIGTERM), and with probability ``--second`` a second
  signal 0.05-2 s later. Each run is classified (:func:`classify`) by what it
  left: exit status, stderr, ``summary.json``, and whether any process it
  started (every descendant seen, every process naming its run directory),
  network namespace or link of its run is still there. The time from the
  second signal to everything gone is measured (the bound is 5 s).

Every run prints one line and a replay line (the master seed and the run's
index give the same draws); the tally per outcome class closes. Exit status
1 if any run failed (or any outcome is a bad class), so a soak can gate a
release by hand; it is not in the test suite (minutes of real processes).

Stops only what it started (the hogs and each run's processes, by PID) on
success, failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import psutil
import yaml

from realrun import cpu_hogs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "tests" / "data" / "scenarios" / "chaos-cr-kill-join-kill.yaml"
RUN_TIMEOUT_S = 300.0
#: a signalled run must have exited this long after its last signal, else it "hung"
EXIT_BOUND_S = 60.0
#: the acceptance bound: the second signal ends everything within this
SECOND_SIGNAL_BOUND_S = 5.0
POLL_S = 0.02
#: the outcome classes that meet the rules; any other is a failure
GOOD = ("completed", "before-run-dir", "interrupted-kept", "finished-before-signal")


# --- drawn scenarios -------------------------------------------------------------------

FAMILIES = ("kill", "pause", "lose_host", "partition", "isolate_keeper", "loss", "kill_keeper")
HOST_FAMILIES = ("lose_host", "partition", "isolate_keeper", "loss")
TRIGGER_KEYS = ("at_step", "at_roll_call", "for_s")  # a fault's keys other than its action


def etcd_installed() -> bool:
    from real.etcd import etcd_binary

    return etcd_binary() is not None


def draw_scenario(seed: int, with_etcd: bool) -> dict[str, Any]:
    """One real scenario drawn from ``seed``: 4 workers, 40-60 steps, one or two
    fault families the real target runs together (host faults need hosts; a
    keeper kill needs etcd and is drawn only where it is installed)."""
    rng = random.Random(f"soak-scenario:{seed}")
    families = [f for f in FAMILIES if with_etcd or f != "kill_keeper"]
    first = rng.choice(families)
    hosts = first in HOST_FAMILIES or (first in ("kill", "pause") and rng.random() < 0.5)
    partners = [f for f in families if f != first and f != "kill_keeper"
                and (hosts or f not in HOST_FAMILIES) and first != "kill_keeper"]
    chosen = [first] + ([rng.choice(partners)] if partners and rng.random() < 0.4 else [])
    steps = rng.choice([40, 50, 60])
    at = sorted(rng.sample(range(6, steps - 12), len(chosen)))
    doc: dict[str, Any] = {
        "name": f"soak-{seed}", "description": f"drawn by soak_real.py, seed {seed}: {chosen}",
        "seed": rng.randrange(1000), "target": "real",
        "cluster": {"workers": 4, **({"workers_per_host": 2} if hosts else {})},
        "workload": {"steps": steps, "global_batch": 32, "micro_batch": 4,
                     "dataset_samples": 512, "model_params": 20000, "lr": 0.05},
        "detector": {"heartbeat_s": 0.1, "timeout_s": rng.choice([1.5, 2.0])},
        "rendezvous": {"min_workers": 2, "last_call_s": 0.2, "join_timeout_s": 20.0},
        "strategy": {"kind": rng.choice(["elastic", "elastic", "checkpoint-restart"]),
                     "batch": "constant", "checkpoint_interval_steps": 10},
        "failures": {"schedule": [_fault(rng, f, step) for f, step in zip(chosen, at)]},
    }
    second = doc["failures"]["schedule"][1:]
    if second and first != "loss" and rng.random() < 0.5:
        # the partner lands during the roll call the first fault opens
        del second[0]["at_step"]
        second[0]["at_roll_call"] = 2
    if "kill_keeper" in chosen:
        doc["keeper"] = {"store": "etcd", "standbys": 1, "lease_ttl_s": 1.0}
    return doc


def _fault(rng: random.Random, family: str, at_step: int) -> dict[str, Any]:
    for_s = round(rng.uniform(1.0, 3.0), 2)
    return {
        "kill": lambda: {"kill": rng.randrange(1, 4)},
        "pause": lambda: {"pause": rng.randrange(1, 4), "for_s": for_s},
        "lose_host": lambda: {"lose_host": 1},
        "partition": lambda: {"partition": [1], "for_s": for_s},
        "isolate_keeper": lambda: {"isolate_keeper": 1, "for_s": for_s},
        "loss": lambda: {"loss": 1, "rate": round(rng.uniform(0.1, 0.4), 2), "for_s": for_s},
        "kill_keeper": lambda: {"kill_keeper": "active"},
    }[family]() | {"at_step": at_step}


# --- one run, watched ------------------------------------------------------------------

@dataclass
class Plan:
    """What one run gets: its scenario, and the signals with their instants."""
    index: int
    scenario: Path
    first: Optional[tuple[int, float, str]] = None   # (signal, seconds after start, "group"|"launcher")
    second_after_s: Optional[float] = None           # the second signal, after the first


@dataclass
class Watched:
    """What a run did and left."""
    rc: Optional[int] = None
    stderr: str = ""
    wall_s: float = 0.0
    started_at: float = 0.0                 # time.time() of the process start
    first_at: Optional[float] = None        # time.time() of each signal sent
    second_at: Optional[float] = None
    gone_after_first_s: Optional[float] = None
    gone_after_second_s: Optional[float] = None
    seen: set[int] = field(default_factory=set)
    left: list[str] = field(default_factory=list)
    hung: bool = False


def draw_plan(master: int, i: int, scenario: Path, signals: bool, window_s: float,
              second: float) -> Plan:
    """Run ``i``'s signals, from the master seed alone (a replay draws the same)."""
    plan = Plan(i, scenario)
    if signals:
        rng = random.Random(f"soak-signal:{master}:{i}")
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        to = "group" if sig == signal.SIGINT and rng.random() < 0.7 else rng.choice(["group", "launcher"])
        plan.first = (int(sig), rng.uniform(0.0, window_s), to)
        if rng.random() < second:
            plan.second_after_s = rng.uniform(0.05, 2.0)
    return plan


def _descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _naming(out: Path) -> set[int]:
    """Running processes whose command line names the run directory (workers,
    host agents, keeper processes and etcd members all do)."""
    needle = str(out)
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and any(needle in a for a in proc.info["cmdline"] or ()) \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def _network_left(out: Path) -> list[str]:
    """The run's network namespaces and links still there (its prefix is in real/network.json)."""
    try:
        prefix = json.loads((out / "real" / "network.json").read_text())["prefix"]
    except (OSError, ValueError, KeyError):
        return []
    left = [f"netns {n}" for n in _listdir("/var/run/netns") if n.startswith(prefix + "-")]
    return left + [f"link {n}" for n in _listdir("/sys/class/net") if n.startswith(prefix + "-")]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def leftovers(proc_pid: int, out: Path, seen: set[int]) -> list[str]:
    """Everything of the run still there: processes (seen as descendants, or
    naming its directory), namespaces, links."""
    pids = {p for p in seen | {proc_pid} if _running(p)} | _naming(out)
    return [f"pid {p}" for p in sorted(pids)] + _network_left(out)


def watch(plan: Plan, out: Path) -> Watched:
    """Start the run in a session of its own, send its signals, wait for its end
    (bounded) and for everything it started to be gone; kill what is left."""
    w = Watched()
    cmd = [sys.executable, "-m", "rollcall", "run", str(plan.scenario), "--target", "real",
           "--out", str(out), "--quiet"]
    err_file = tempfile.TemporaryFile()
    t0 = time.monotonic()
    w.started_at = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err_file,
                            start_new_session=True)
    sent: list[float] = []
    try:
        _supervise(plan, proc, w, t0, sent)
        _wait_gone(proc, out, w, sent)
    finally:
        _kill_left(proc, out, w)
        err_file.seek(0)
        w.stderr = err_file.read().decode(errors="replace")
        err_file.close()
    return w


def _send(plan: Plan, proc: subprocess.Popen, sig: int) -> None:
    assert plan.first is not None
    try:
        if plan.first[2] == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def _supervise(plan: Plan, proc: subprocess.Popen, w: Watched, t0: float,
               sent: list[float]) -> None:
    """Poll the run until it exits: record its descendants, send its signals due."""
    deadline = t0 + RUN_TIMEOUT_S
    while proc.poll() is None:
        now = time.monotonic()
        w.seen |= _descendants(proc.pid)
        if plan.first is not None and not sent and now - t0 >= plan.first[1]:
            _send(plan, proc, plan.first[0])
            sent.append(now)
            w.first_at = time.time()
        elif sent and len(sent) == 1 and plan.second_after_s is not None \
                and now - sent[0] >= plan.second_after_s:
            _send(plan, proc, plan.first[0])  # type: ignore[index]
            sent.append(now)
            w.second_at = time.time()
        if now > (sent[-1] + EXIT_BOUND_S if sent else deadline):
            w.hung = True
            return
        time.sleep(POLL_S)  # bounded poll of the run and of the signal's instant
    w.rc = proc.returncode
    w.wall_s = time.monotonic() - t0


def _wait_gone(proc: subprocess.Popen, out: Path, w: Watched, sent: list[float]) -> None:
    """After the exit: how long from each signal until nothing of the run is left (bounded)."""
    deadline = time.monotonic() + 30.0
    while True:
        left = leftovers(proc.pid, out, w.seen) if proc.poll() is not None else ["launcher"]
        now = time.monotonic()
        if not left or now > deadline:
            break
        time.sleep(POLL_S)  # bounded poll for the processes' ends
    w.left = left
    if not left and sent:
        w.gone_after_first_s = now - sent[0]
        if len(sent) > 1:
            w.gone_after_second_s = now - sent[1]


def _kill_left(proc: subprocess.Popen, out: Path, w: Watched) -> None:
    """SIGKILL what the run left (ours only: its launcher, its descendants, what names its directory)."""
    for pid in sorted({proc.pid} | w.seen | _naming(out)):
        if _running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


# --- outcome ---------------------------------------------------------------------------

def _summary(out: Path) -> Optional[dict]:
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def classify(plan: Plan, w: Watched, out: Path) -> str:
    """The outcome class of a run (see the module docstring); GOOD are the allowed ones."""
    if w.hung:
        return "hung"
    rc = w.rc
    if rc is not None and rc < 0:  # killed by a signal's default action: no handler ran
        if -rc not in (signal.SIGINT, signal.SIGTERM):
            return f"crash ({signal.Signals(-rc).name})"
        rc = 128 - rc  # as a shell reports it; a silent death shows as stderr without its line
    if rc in (134, 139):  # a shell's report of SIGABRT, SIGSEGV
        return f"crash (rc {rc})"
    if "Traceback" in w.stderr:
        return "traceback"
    if w.left:
        return "left-behind"
    s = _summary(out)
    if plan.first is None:  # no signal: the run must complete, valid
        ok = s is not None and s.get("completed") is True and s.get("valid") is True
        return "completed" if ok else f"not completed or not valid (rc {rc})"
    if w.first_at is None:  # ended before its instant: the signal was never sent
        return "finished-before-signal" if rc in (0, 1) and s else f"rc {rc}"
    if rc == 128 + plan.first[0]:
        if s is None:
            written = out.exists() and any(out.iterdir())
            lines = [x for x in w.stderr.splitlines() if x.strip()]
            return "written-no-summary" if written else (
                "before-run-dir" if len(lines) == 1 else f"before-run-dir, {len(lines)} lines")
        if s.get("result") != "interrupted":
            return f"signal exit, summary {s.get('result')}"
        return "interrupted-kept" if (out / "history.jsonl").exists() else "no-history"
    if rc in (0, 1) and s is not None and s.get("result") != "interrupted":
        return "finished-before-signal" if _ended_before(out, s, w.first_at) else "signal-ignored"
    return f"rc {rc}, summary {None if s is None else s.get('result')}"


def _ended_before(out: Path, s: dict, signal_at: float) -> bool:
    """Whether the run had ended (its launcher's result decided) before the signal:
    the launcher's clock starts as it writes real/scenario.json, its end is wall_s."""
    try:
        start = (out / "real" / "scenario.json").stat().st_mtime
    except OSError:
        return False
    return start + float(s.get("wall_s") or 0.0) <= signal_at + 0.25


# --- the soak --------------------------------------------------------------------------

def calibrate_window(scenario: Path, root: Path) -> float:
    """A little past one unsignalled run's length: the span the signal instants cover."""
    w = watch(Plan(-1, scenario), root / "calibration")
    return 1.15 * w.wall_s


def run_one(args: argparse.Namespace, i: int, root: Path, window_s: float,
            with_etcd: bool) -> tuple[str, Watched]:
    scenario = args.scenario
    note = ""
    if args.faults:
        doc = draw_scenario(args.seed * 10_000 + i, with_etcd)
        scenario = root / f"run-{i:02d}.yaml"
        scenario.write_text(yaml.safe_dump(doc, sort_keys=False))
        note = "faults " + ",".join(next(k for k in f if k not in TRIGGER_KEYS)
                                    for f in doc["failures"]["schedule"])
    plan = draw_plan(args.seed, i, scenario, args.signals, window_s, args.second)
    out = root / f"run-{i:02d}"
    w = watch(plan, out)
    outcome = classify(plan, w, out)
    s = _summary(out) or {}
    with open(root / "soak.jsonl", "a") as fh:  # what a later look at the soak needs
        fh.write(json.dumps({"run": i, "outcome": outcome, "rc": w.rc, "plan": [plan.first, plan.second_after_s],
                             "stderr": w.stderr[-2000:], "left": w.left, "seen": sorted(w.seen),
                             "gone_after_first_s": w.gone_after_first_s,
                             "gone_after_second_s": w.gone_after_second_s}) + "\n")
    sig = "" if plan.first is None else (
        f"{signal.Signals(plan.first[0]).name}@{plan.first[1]:.2f}s->{plan.first[2]}"
        + ("" if plan.second_after_s is None else f" +2nd@{plan.second_after_s:.2f}s"))
    gone = "" if w.gone_after_second_s is None else f" gone_after_2nd_s={w.gone_after_second_s:.2f}"
    print(f"run {i:2d}: {outcome:24s} rc={w.rc} result={s.get('result')} valid={s.get('valid')} "
          f"wall_s={w.wall_s:.2f} {note} {sig}{gone}"
          + ("" if outcome in GOOD else f"  [{out}] left={w.left[:4]} "
             f"stderr={w.stderr.strip().splitlines()[-1:]}"), flush=True)
    print(f"  replay: {_replay(args, i)}", flush=True)
    return outcome, w


def _replay(args: argparse.Namespace, i: int) -> str:
    parts = [".venv/bin/python", "benchmarks/soak_real.py", "--seed", str(args.seed), "--only", str(i),
             "--hogs", str(args.hogs)]
    if args.faults:
        parts.append("--faults")
    else:
        parts.append(str(args.scenario))
    if args.signals:
        parts += ["--signals", "--window-s", f"{args.window_s:.3f}", "--second", str(args.second)]
    return " ".join(shlex.quote(p) for p in parts)


def report(outcomes: list[tuple[str, Watched]], signals: bool) -> bool:
    """Print the tally and the second-signal times; True when every run met the rules."""
    tally = Counter(o for o, _ in outcomes)
    print("outcomes: " + ", ".join(f"{k}: {v}" for k, v in sorted(tally.items())))
    if signals:
        seconds = [w.gone_after_second_s for _, w in outcomes if w.gone_after_second_s is not None]
        if seconds:
            over = sum(s > SECOND_SIGNAL_BOUND_S for s in seconds)
            print(f"second signal -> everything gone: n={len(seconds)} median "
                  f"{statistics.median(seconds):.2f} s, max {max(seconds):.2f} s, "
                  f"{over} over {SECOND_SIGNAL_BOUND_S:g} s")
            if over:
                return False
    return all(o in GOOD for o, _ in outcomes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside the runs")
    ap.add_argument("--out", type=Path, default=None, help="where the run directories go")
    ap.add_argument("--seed", type=int, default=None, help="master seed (default: drawn, printed)")
    ap.add_argument("--faults", action="store_true", help="draw each run's scenario (faults at random)")
    ap.add_argument("--signals", action="store_true", help="SIGINT/SIGTERM at a random instant")
    ap.add_argument("--second", type=float, default=0.5, help="chance of a second signal")
    ap.add_argument("--window-s", type=float, default=None,
                    help="signal instants in [0, W] s after the start (default: a measured run)")
    ap.add_argument("--only", type=int, default=None, help="run only this index (a replay)")
    args = ap.parse_args()
    if not args.faults and not args.scenario.is_file():
        print(f"soak_real: no such scenario file: {args.scenario}", file=sys.stderr)
        return 2
    if args.runs < 1 or args.hogs < 0 or not 0.0 <= args.second <= 1.0:
        print("soak_real: --runs must be >= 1, --hogs >= 0, 0 <= --second <= 1", file=sys.stderr)
        return 2
    args.seed = random.randrange(1 << 20) if args.seed is None else args.seed
    root = args.out or Path(tempfile.mkdtemp(prefix="rollcall-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    with_etcd = etcd_installed()
    indices = [args.only] if args.only is not None else list(range(args.runs))
    print(f"soak: seed {args.seed}, {'drawn scenarios' if args.faults else args.scenario.name}, "
          f"{len(indices)} run(s), {args.hogs} hog(s), signals {args.signals}, "
          f"etcd {'yes' if with_etcd else 'no (no keeper kills)'}; runs in {root}", flush=True)
    outcomes = []
    with cpu_hogs(args.hogs):
        if args.signals and args.window_s is None:
            args.window_s = calibrate_window(ROOT / "scenarios" / "real-kill-one.yaml", root)
            print(f"signal window: [0, {args.window_s:.2f}] s (1.15 x one unsignalled run)")
        for i in indices:
            outcomes.append(run_one(args, i, root, args.window_s or 0.0, with_etcd))
    ok = report(outcomes, args.signals)
    if ok and args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
