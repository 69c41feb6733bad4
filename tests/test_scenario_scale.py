"""The scale helpers: cluster.gpus, fractional rendezvous bounds, a per-worker batch and
failure rates per 1,000 node-days, each resolved into its canonical key.

Bad values of each are cases of tests/test_scenario_errors.py (one line, exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rollcall.app import cli
from rollcall.app import sweeps as sw
from rollcall.results import scenario_hash
from rollcall.scenario import NODE_DAYS_S, ScenarioError, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parent.parent


def _sc(text: str, *sets: str):
    return parse_scenario(text, "s.yaml", list(sets))


def test_gpus_resolve_to_workers_and_leave_no_trace() -> None:
    by_gpus = _sc("name: a\ncluster: {gpus: 64, gpus_per_worker: 8}\n")
    by_workers = _sc("name: a\ncluster: {workers: 8, gpus_per_worker: 8}\n")
    assert by_gpus.cluster.workers == 8 and by_gpus.rendezvous.max_workers == 8
    assert by_gpus == by_workers
    assert by_gpus.to_dict() == by_workers.to_dict() and "gpus" not in by_gpus.to_dict()["cluster"]
    assert scenario_hash(by_gpus) == scenario_hash(by_workers)
    # the resolved YAML reads back to the same scenario (what a run's scenario.yaml is)
    assert parse_scenario(by_gpus.to_yaml()) == by_gpus
    # both keys in one file: fine when they agree
    assert _sc("name: a\ncluster: {gpus: 64, gpus_per_worker: 8, workers: 8}\n") == by_workers


@pytest.mark.parametrize("text, where, fragment", [
    ("cluster: {gpus: 60, gpus_per_worker: 8}", "cluster.gpus", "multiple of cluster.gpus_per_worker=8"),
    ("cluster: {gpus: 16, workers: 4}", "cluster.gpus", "16 GPUs are 16 workers of 1 GPUs"),
    ("cluster: {gpus: 0}", "cluster.gpus", "got 0"),
    ("cluster: {gpus: true}", "cluster.gpus", "got true"),
    ("cluster: {gpus: 8.0}", "cluster.gpus", "got 8.0"),
])
def test_bad_gpus(text: str, where: str, fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        _sc(f"name: a\n{text}\n")
    assert info.value.field == where and fragment in str(info.value), str(info.value)


def test_an_override_of_one_spelling_replaces_the_other() -> None:
    # the later word wins, as for any override, instead of a conflict between layers
    assert _sc("name: a\ncluster: {workers: 4}\n", "cluster.gpus=16").cluster.workers == 16
    assert _sc("name: a\ncluster: {gpus: 4}\n", "cluster.workers=16").cluster.workers == 16
    assert _sc("name: a\ncluster: {workers: 2}\n", "cluster.gpus=4", "cluster.workers=3").cluster.workers == 3
    sc = _sc("name: a\nworkload: {global_batch: 64}\n", "workload.per_worker_batch=4")
    assert sc.workload.global_batch == 16
    sc = _sc("name: a\nfailures: {worker_mtbf_s: 5.0}\n", "failures.per_1000_node_days=10")
    assert sc.failures.worker_mtbf_s == NODE_DAYS_S / 10
    sc = _sc("name: a\nfailures: {per_1000_node_days: 10}\n", "failures.worker_mtbf_s=7.5")
    assert sc.failures.worker_mtbf_s == 7.5


@pytest.mark.parametrize("workers, min_w, max_w, want", [
    (10, 0.9, None, (9, 10)),          # exactly 9: 0.9 is 9/10, not 0.900...02 (ceil would say 10)
    (10, "90%", "100%", (9, 10)),
    (8, 0.9, 1.0, (8, 8)),             # 7.2 rounds up: at least 90% are there
    (2048, "75%", None, (1536, 2048)),
    (10, 0.01, None, (1, 10)),
    (10, " 12.5 %", 1.0, (2, 10)),
    (4, 3, "100%", (3, 4)),            # an integer is a count
])
def test_fractions_of_the_workers(workers: int, min_w, max_w, want: tuple[int, int]) -> None:
    rdv = {"min_workers": min_w} | ({} if max_w is None else {"max_workers": max_w})
    text = yaml.safe_dump({"name": "a", "cluster": {"workers": workers}, "rendezvous": rdv})
    sc = _sc(text)
    assert (sc.rendezvous.min_workers, sc.rendezvous.max_workers) == want


@pytest.mark.parametrize("rdv, where, fragment", [
    ({"min_workers": 1.5}, "rendezvous.min_workers", "a fraction is at most 1"),
    ({"min_workers": "150%"}, "rendezvous.min_workers", "a fraction is at most 1"),
    ({"min_workers": 0.0}, "rendezvous.min_workers", "got 0.0"),
    ({"min_workers": "lots"}, "rendezvous.min_workers", "a percentage such as '90%', got 'lots'"),
    ({"min_workers": True}, "rendezvous.min_workers", "got true"),
    ({"max_workers": 0.5}, "rendezvous.max_workers", "0.5 of cluster.workers=10 is 5 (rounded down)"),
    ({"min_workers": 0.5, "max_workers": 9}, "rendezvous.max_workers", "must be >= cluster.workers=10"),
])
def test_bad_fractions(rdv: dict, where: str, fragment: str) -> None:
    text = yaml.safe_dump({"name": "a", "cluster": {"workers": 10}, "rendezvous": rdv})
    with pytest.raises(ScenarioError) as info:
        _sc(text)
    assert info.value.field == where and fragment in str(info.value), str(info.value)


def test_per_worker_batch_and_failure_rate() -> None:
    sc = _sc("name: a\ncluster: {workers: 8}\nworkload: {per_worker_batch: 16, micro_batch: 4}\n")
    assert sc.workload.global_batch == 128 and "per_worker_batch" not in sc.to_dict()["workload"]
    # weak scaling: the per-worker batch stays, the global one follows the workers
    assert _sc("name: a\nworkload: {per_worker_batch: 16}\n", "cluster.gpus=32").workload.global_batch == 512
    sc = _sc("name: a\nfailures: {per_1000_node_days: 3.8}\n")
    assert sc.failures.worker_mtbf_s == pytest.approx(1000 * 86_400 / 3.8)
    assert "per_1000_node_days" not in sc.to_dict()["failures"]
    llama = load_scenario(ROOT / "scenarios" / "llama3-54d.yaml")
    same = load_scenario(ROOT / "scenarios" / "llama3-54d.yaml",
                         ["failures.per_1000_node_days=3.8", "cluster.gpus=16384",
                          "rendezvous.min_workers=75%"])
    assert same.cluster == llama.cluster and same.rendezvous == llama.rendezvous
    assert same.failures.worker_mtbf_s == pytest.approx(llama.failures.worker_mtbf_s)
    for text, fragment in (("workload: {per_worker_batch: 0}", "got 0"),
                           ("workload: {per_worker_batch: 8, micro_batch: 3}", "must divide"),
                           ("failures: {per_1000_node_days: -1}", "got -1"),
                           ("failures: {per_1000_node_days: .inf}", "got inf")):
        with pytest.raises(ScenarioError, match=fragment):
            _sc(f"name: a\n{text}\n")


def test_cli_gpus_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = ROOT / "scenarios" / "llama3-54d.yaml"
    # the file's min_workers (1536) is a count: a smaller job needs its own, or a fraction
    assert cli.main(["validate", str(path), "--gpus", "8192"]) == 2
    assert "min_workers" in capsys.readouterr().err
    assert cli.main(["validate", str(path), "--gpus", "8192", "--set", "rendezvous.min_workers=75%",
                     "--plan"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1].partition("\nplan: ")[0])
    assert resolved["cluster"]["workers"] == 1024 and "gpus" not in resolved["cluster"]
    assert resolved["rendezvous"]["min_workers"] == 768
    # after --gpus, a later --set of the worker count wins (command-line order)
    assert cli.main(["validate", str(path), "--gpus", "8192", "--set", "cluster.workers=2048",
                     "--plan"]) == 0
    assert "  workers: 2048\n" in capsys.readouterr().out
    # argparse's refusals exit 2 through SystemExit with one line
    for bad in ("0", "x"):
        with pytest.raises(SystemExit) as info:
            cli.main(["validate", str(path), "--gpus", bad])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "--gpus" in err
    assert cli.main(["validate", str(path), "--gpus", "8191"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rollcall: {path}: cluster.gpus (from --set): must be a multiple of "
        f"cluster.gpus_per_worker=8 (whole workers), got 8191"]


def test_sweep_over_gpus_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: gpus-sweep\ncluster: {workers: 2, gpus_per_worker: 2}\n"
        "workload: {steps: 40, per_worker_batch: 8, micro_batch: 8}\n"
        "rendezvous: {min_workers: '50%', max_workers: 1.0}\n"
        "failures:\n  schedule:\n    - {at_step: 10, kill: 0}\n")
    out = tmp_path / "sw"
    args = ["sweep", str(scenario), "--grid", "cluster.gpus=4,8", "--seeds", "1", "--jobs", "1",
            "--out", str(out), "--quiet"]
    assert cli.main(args) == 0
    assert "runs: 4  not completed: 0  invalid: 0" in capsys.readouterr().out
    csv = pd.read_csv(out / sw.CSV_FILE)
    assert sorted(csv["cluster.gpus"]) == [4, 4, 8, 8]
    for _, row in csv.iterrows():
        resolved = yaml.safe_load((out / row["run_dir"] / "scenario.yaml").read_text())
        workers = resolved["cluster"]["workers"]
        assert workers == row["cluster.gpus"] // 2 and "gpus" not in resolved["cluster"]
        assert resolved["workload"]["global_batch"] == 8 * workers
        assert resolved["rendezvous"]["min_workers"] == workers // 2
    before = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    assert cli.main(args) == 0  # the same sweep again: every point is done, nothing reruns
    assert {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")} == before


def test_compare_with_gpus_resumes_and_a_new_size_reruns(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: gpus-compare\ncluster: {gpus: 2}\nworkload: {steps: 40, per_worker_batch: 8, micro_batch: 8}\n"
        "failures:\n  per_1000_node_days: 1.0e6\n")  # an MTBF of 86.4 s: a few failures per run
    out = tmp_path / "cmp"
    args = ["compare", str(scenario), "--gpus", "4", "--seeds", "1", "--out", str(out), "--json"]
    assert cli.main(args) == 0
    first = json.loads(capsys.readouterr().out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    assert len(before) == 2
    for path in out.rglob("scenario.yaml"):
        resolved = yaml.safe_load(path.read_text())
        assert resolved["cluster"]["workers"] == 4 and resolved["workload"]["global_batch"] == 32
        assert resolved["failures"]["worker_mtbf_s"] == 86.4
    assert cli.main(args) == 0  # the same command: both runs read back, none rerun
    assert json.loads(capsys.readouterr().out)["verdict"] == first["verdict"]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")} == before
    assert cli.main(args[:3] + ["8"] + args[4:]) == 0  # another size: another scenario, rerun
    capsys.readouterr()
    after = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    assert all(after[p] != m for p, m in before.items())
