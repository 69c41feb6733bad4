"""compare(): both strategies per seed, same failure trace, t-intervals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollcall.scenario import load_scenario
from rollcall.app.comparison import METRICS, STRATEGIES, mean_ci, t975
from rollcall.app.comparison import on_target


ROOT = Path(__file__).resolve().parent.parent


def test_t_interval() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(30) == pytest.approx(2.042)
    assert 2.000 < t975(50) < 2.021 and 1.96 < t975(1000) < 1.965
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_ci([5.0])[1])


def test_compare_table_and_runs(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                       ["failures.worker_mtbf_s=60", "cluster.repair_s=10"])
    table = on_target("sim")(sc, [4, 5], tmp_path).rounded_table()
    assert list(table.columns) == [(s, c) for s in STRATEGIES for c in ("mean", "±95%")]
    assert list(table.index) == list(METRICS)
    assert table.loc["valid", ("elastic", "mean")] == 1.0
    assert table.loc["restarts", ("elastic", "mean")] == 0.0
    for s in STRATEGIES:
        for seed in (4, 5):
            assert (tmp_path / f"{s}-seed{seed}" / "summary.json").exists()
    for name in ("compare.csv", "compare-table.csv", "compare-paired.csv"):
        assert (tmp_path / name).exists()
