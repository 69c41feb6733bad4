"""What the real-target benchmarks share (a helper, not a benchmark).

CPU hogs beside the runs, the refusal of a hosts scenario where namespaces
cannot be made, and one in-process real run read back as its history.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@contextmanager
def cpu_hogs(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` busy-loop processes for the duration; stopped by PID (ours only)
    on the way out, whatever the way out is."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield hogs
    finally:
        for h in hogs:
            if h.poll() is None:
                h.kill()
        for h in hogs:
            h.wait(timeout=10)


def namespaces_refused(tool: str, scenario: str) -> Optional[str]:
    """Why ``scenario`` (its hosts are network namespaces) cannot run here, as
    the one line ``tool`` prints before it exits 2; None when it can."""
    from real.netns import netns_available

    why = netns_available()
    return None if why is None else f"{tool}: {scenario} runs its hosts as network namespaces: {why}"


def real_records(scenario: str, overrides: list[str]) -> tuple[list[dict], float]:
    """Run ``scenarios/<scenario>.yaml`` with ``overrides`` on the real target
    (it must complete, valid); its history records and detector timeout."""
    from real.driver import run
    from rollcall.results import read_history
    from rollcall.scenario import load_scenario

    sc = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", overrides)
    with tempfile.TemporaryDirectory() as d:
        summary = run(sc, d)
        recs = list(read_history(d))
    assert summary["valid"] and summary["completed"], summary["violations"]
    return recs, sc.detector.timeout_s
