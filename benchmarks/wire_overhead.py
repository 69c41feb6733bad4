"""What the checked JSON wire costs a real 4-worker step, against the old pickle wire (not a test).

Per step each worker sends a commit request and its ``contribute`` record
and gets an ack; heartbeats add a frame every ``heartbeat_s``. This times
encoding and decoding exactly those frames, both ways, for the wire in
``real/wire.py`` (JSON, every field checked) and for plain pickle (what the
wire was), and prints each as a share of a measured real step (the median
committed step of a short real run, or ``--step-s``). The handshake (one
HMAC per connection) is timed too, once per worker life, not per step.

    .venv/bin/python benchmarks/wire_overhead.py               # runs real-kill-one once to time a step
    .venv/bin/python benchmarks/wire_overhead.py --step-s 0.045

Goal: authentication and the checked wire cost at most 1% of a step.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.core import Heartbeat  # noqa: E402
from real import wire  # noqa: E402


def step_frames(workers: int, per_worker_samples: int) -> tuple[list[tuple], list[tuple]]:
    """The frames of one step: to the launcher (per worker) and back."""
    up, down = [], []
    for w in range(workers):
        record = {"t": 1.234, "type": "ok", "f": "commit", "process": w, "gen": 3, "step": 41,
                  "last": 41, "sample": 1312, "stop": 1344, "batch": 32, "t0": 1.19}
        up.append(("commit", w, 0, 3, 41, record))
        up.append(("rec", {"t": 1.23, "type": "ok", "f": "contribute", "process": w, "gen": 3,
                           "step": 41, "samples": list(range(per_worker_samples))}))
        up.append(("msg", Heartbeat(w, 0, 3, 17)))
        down.append(("ack", 3, 41, True))
    return up, down


def per_step_s(frames_up: list[tuple], frames_down: list[tuple], json_wire: bool,
               repeat: int) -> float:
    """Seconds to encode and decode one step's frames."""
    t = time.perf_counter()
    for _ in range(repeat):
        if json_wire:
            r_up = wire.FrameReader(wire.TO_LAUNCHER, wire.MAX_FRAME)
            r_down = wire.FrameReader(wire.TO_WORKER, wire.MAX_FRAME)
            r_up.feed(b"".join(map(wire.encode, frames_up)))
            r_down.feed(b"".join(map(wire.encode, frames_down)))
        else:
            for f in frames_up + frames_down:
                pickle.loads(pickle.dumps(f, protocol=pickle.HIGHEST_PROTOCOL))
    return (time.perf_counter() - t) / repeat


def handshake_s(repeat: int = 2000) -> float:
    key, nonce, run = b"k" * wire.SECRET_BYTES, wire.new_nonce(), wire.new_nonce()
    t = time.perf_counter()
    for _ in range(repeat):
        mac = wire.hello_mac(key, nonce, run, 3, 0, 1234, False)
        assert wire.hello_ok(key, nonce, run, ("hello", 3, 0, 1234, False, mac))
    return (time.perf_counter() - t) / repeat


def measured_step_s() -> float:
    from real.driver import run
    from rollcall.scenario import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "real-kill-one.yaml",
                       ["failures.schedule=[]", "workload.steps=100"])
    with tempfile.TemporaryDirectory() as d:
        run(sc, d)
        from rollcall.results import read_history
        steps = [r["t"] - r["t0"] for r in read_history(d) if r["f"] == "commit"]
    return statistics.median(steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-s", type=float, help="a step's time (default: measure a real run)")
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    step = args.step_s if args.step_s else measured_step_s()
    up, down = step_frames(4, 8)
    cost = {"json (checked)": per_step_s(up, down, True, args.repeat),
            "pickle (old)": per_step_s(up, down, False, args.repeat)}
    print(f"real step: {step * 1e3:.2f} ms (4 workers)")
    for name, s in cost.items():
        print(f"{name:<16} {s * 1e6:8.1f} us per step  {100 * s / step:6.3f}% of a step")
    print(f"json / pickle: {cost['json (checked)'] / cost['pickle (old)']:.2f}x")
    print(f"handshake (HMAC, once per connection): {handshake_s() * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
