"""Both strategies per seed on the real target: ``compare(scenario, seeds, out_dir)``.

The loop, the rows, the table and the CSV files are
:func:`rollcall.comparison.compare` (shared with ``sim.compare``); this module
hands it :func:`real.driver.run`. A scripted fault hits both strategies at
the same step (``at_step``) or second of training (``at_s``); random (MTBF)
crashes come from the same seeded node lifetimes as on the sim, but in real
seconds, so which step they hit depends on the machine's speed at the time.

Ctrl-C (or SIGTERM) during a run is caught by the launcher, which stops every
worker and returns a summary with ``result: interrupted``; here that becomes
a KeyboardInterrupt again, so the compare stops with the finished runs in
``compare.csv`` and the interrupted one left out (its run directory keeps its
history and summary). The real summary has no ``checkpoint_s`` (checkpoint
writes are not timed into it), so the table leaves that metric out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from rollcall import comparison as shared
from rollcall.scenario import Scenario

from real.driver import run


def run_or_raise(scenario: Scenario, out_dir: Path,
                 max_wall_s: Optional[float] = None) -> dict[str, Any]:
    """``real.driver.run``, but an interrupted run raises instead of returning a row."""
    summary = run(scenario, out_dir, max_wall_s=max_wall_s)
    if summary.get("result") == "interrupted":
        raise KeyboardInterrupt(summary.get("reason", "interrupted"))
    return summary


def compare(scenario: Scenario, seeds: Sequence[int], out_dir: str | Path,
            max_wall_s: Optional[float] = None, **options: Any) -> shared.Comparison:
    """Run both strategies per seed on real processes; writes ``compare.csv``,
    ``compare-table.csv`` and ``compare-paired.csv``. ``options`` go to
    :func:`rollcall.comparison.compare` (``fixed_interval``, ``engine``);
    ``max_wall_s`` bounds each run's wall time."""
    return shared.compare(scenario, seeds, out_dir,
                          lambda sc, d: run_or_raise(sc, d, max_wall_s),
                          max_wall_s=max_wall_s, **options)
