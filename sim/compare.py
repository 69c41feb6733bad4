"""Both strategies on the same failure traces, on the sim: ``compare(scenario, seeds, out_dir)``.

The loop, the per-run rows, the table and the CSV files are
:func:`rollcall.comparison.compare` (shared with ``real.compare``); this module
hands it the sim driver. The failure trace is drawn from streams that do not
depend on the strategy (``failures`` and ``node/<i>``, see
:mod:`sim.driver`), so both strategies meet the same crashes at the same
simulated instants (scripted ``at_step`` faults and ``kill: random`` follow
the job, by definition).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from rollcall import comparison as shared
from rollcall.comparison import METRICS, STRATEGIES, mean_ci, summarize, t975, with_strategy
from rollcall.scenario import Scenario

from sim.driver import run

__all__ = ["METRICS", "STRATEGIES", "compare", "mean_ci", "summarize", "t975", "with_strategy"]


def compare(scenario: Scenario, seeds: Sequence[int], out_dir: str | Path,
            stop: Optional[Callable[[], Optional[str]]] = None,
            max_wall_s: Optional[float] = None, **options: Any) -> shared.Comparison:
    """Run both strategies per seed on the sim; writes ``compare.csv``, ``compare-table.csv``
    and ``compare-paired.csv``. ``options`` go to :func:`rollcall.comparison.compare`
    (``fixed_interval``, ``engine``); ``max_wall_s`` bounds each run's wall time.

    ``stop`` is polled by each run (:func:`sim.driver.run`); a run it ends
    keeps its history and its ``result: interrupted`` summary, and the
    compare stops there with a KeyboardInterrupt, as ``real.compare`` does.
    """
    def run_or_raise(sc: Scenario, run_dir: Path) -> dict[str, Any]:
        summary = run(sc, run_dir, stop=stop, max_wall_s=max_wall_s)
        if summary.get("result") == "interrupted":
            raise KeyboardInterrupt(summary.get("end_reason", "interrupted"))
        return summary

    return shared.compare(scenario, seeds, out_dir, run_or_raise, max_wall_s=max_wall_s,
                          **options)
