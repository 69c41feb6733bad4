"""Every malformed scenario gives exit 2 and ONE line naming the file, the field and the line.

Most files go through ``cli.main`` in-process (fast); a handful go through a
real ``python -m rollcall`` subprocess so the whole path (no traceback, exit
status, stderr) is exercised as a person sees it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollcall.app import cli

BAD = Path(__file__).parent / "data" / "bad"
ROOT = Path(__file__).resolve().parent.parent

# file -> (field named in the message, line or None, fragment of the explanation)
CASES: dict[str, tuple[str, int | None, str]] = {
    "wrong_type_workers.yaml": ("cluster.workers", 4, "expected an integer, got 'four'"),
    "unknown_top_key.yaml": ("seeed", 2, "unknown key (expected one of: name,"),
    "unknown_nested_key.yaml": (
        "cluster.wrokers", 4,
        "unknown key (expected one of: workers, gpus_per_worker, spares, repair_s, repair, spare_pool, preempt_s, launch_s, warm_standbys, select_s, rack_size, workers_per_host, device, backend, gpus)"
    ),
    "negative_time.yaml": ("strategy.restart_s", 4, "must be >= 0, got -30"),
    "negative_latency.yaml": ("network.latency_s", 3, "must be >= 0"),
    "negative_at_s.yaml": ("failures.schedule.0.at_s", 4, "must be >= 0"),
    "micro_batch_not_dividing.yaml": (
        "workload.micro_batch", 5, "must divide workload.global_batch=64, got 7"
    ),
    "min_gt_max.yaml": ("rendezvous.min_workers", 6, "must be <= rendezvous.max_workers=4, got 5"),
    "max_below_workers.yaml": ("rendezvous.max_workers", 5, "must be >= cluster.workers=8, got 6"),
    "min_unreachable.yaml": ("rendezvous.min_workers", 6, "can never start"),
    "timeout_le_heartbeat.yaml": ("detector.timeout_s", 4, "must be > detector.heartbeat_s=2"),
    "pause_without_for_s.yaml": ("failures.schedule.1.for_s", 6, "required with pause"),
    "for_s_with_kill.yaml": ("failures.schedule.0.for_s", 6, "only allowed with pause"),
    "two_triggers.yaml": ("failures.schedule.0.at_step", 5, "exactly one trigger"),
    "two_actions.yaml": ("failures.schedule.0.join", 6, "exactly one action, got kill and join"),
    "no_trigger.yaml": ("failures.schedule.0", 4, "needs exactly one trigger"),
    "fault_unknown_key.yaml": ("failures.schedule.0.kil", 5, "unknown key"),
    "unknown_distribution.yaml": (
        "failures.distribution", 4, "expected 'exponential', 'weibull' or 'lognormal', got 'gamma'"
    ),
    "bad_yaml_syntax.yaml": ("yaml syntax", 4, "started at line 3"),
    "empty.yaml": ("top level", 1, "empty"),
    "top_level_list.yaml": ("top level", 1, "expected a mapping of scenario keys, got a list"),
    "kill_unknown_worker.yaml": ("failures.schedule.1.kill", 10, "worker 6 does not exist"),
    "pause_unknown_worker.yaml": ("failures.schedule.0.pause", 5, "worker 4 does not exist"),
    "missing_name.yaml": ("name", None, "required key is missing"),
    "bad_name.yaml": ("name", 1, "got 'kill one of four'"),
    "unknown_target.yaml": ("target", 2, "expected 'sim' or 'real', got 'gpu'"),
    "unknown_strategy.yaml": ("strategy.kind", 3, "got 'torchrun'"),
    "unknown_detector.yaml": ("detector.kind", 3, "expected 'timeout'"),
    "section_not_mapping.yaml": ("cluster", 2, "expected a mapping, got 4"),
    "schedule_not_list.yaml": ("failures.schedule", 3, "expected a list"),
    "duplicate_key.yaml": ("workload.steps", 4, "duplicate key (first at line 3)"),
    "bool_for_int.yaml": ("workload.steps", 3, "expected an integer, got true"),
    "float_for_int.yaml": ("workload.global_batch", 3, "expected an integer, got 64.5"),
    "string_number.yaml": ("workload.lr", 3, "expected a number, got '0.1'"),
    "infinite_time.yaml": ("failures.worker_mtbf_s", 3, "finite"),
    "join_zero.yaml": ("failures.schedule.0.join", 5, "must be >= 1, got 0"),
    "kill_empty_list.yaml": ("failures.schedule.0.kill", 5, "at least one worker id"),
    "zero_workers.yaml": ("cluster.workers", 3, "must be >= 1, got 0"),
    # sharded state and failure domains
    "kill_rack_without_rack_size.yaml": ("failures.schedule.0.kill_rack", 7, "needs cluster.rack_size"),
    "kill_rack_unknown_rack.yaml": (
        "failures.schedule.1.kill_rack", 11, "rack 3 does not exist (racks are 0..2: worker ids 0..9"
    ),
    "kill_rack_negative.yaml": ("failures.schedule.0.kill_rack", 8, "rack indices are >= 0, got -1"),
    "kill_rack_list.yaml": ("failures.schedule.0.kill_rack", 8, "expected a rack index"),
    "unknown_sharding.yaml": ("state.sharding", 3, "expected 'replicated' or 'sharded', got 'zero3'"),
    "zero_replicas.yaml": ("state.replicas", 6, "must be >= 1, got 0"),
    "step_table_zero_workers.yaml": ("workload.step_s_by_workers.0", 4, "the key must be >= 1, got 0"),
    "step_table_negative.yaml": ("workload.step_s_by_workers.4", 3, "must be > 0, got -0.5"),
    "warmup_negative.yaml": ("workload.warmup_s", 3, "must be >= 0, got -1.0"),
    "zero_rack_size.yaml": ("cluster.rack_size", 4, "must be >= 1, got 0"),
    "repair_unknown_key.yaml": ("cluster.repair.fixed_s", 4,
                                "unknown key (expected one of: auto_s, manual_s,"),
    "state_unknown_key.yaml": ("state.replica", 4, "unknown key (expected one of: sharding, replicas, shards)"),
    # scale helpers (cluster.gpus, fractions, per-worker batch, rate per 1,000 node-days)
    "gpus_not_multiple.yaml": ("cluster.gpus", 4, "must be a multiple of cluster.gpus_per_worker=8"),
    "gpus_disagree.yaml": ("cluster.gpus", 5, "64 GPUs are 8 workers of 8 GPUs, but cluster.workers=4"),
    "fraction_above_one.yaml": ("rendezvous.min_workers", 5, "a fraction is at most 1"),
    "max_fraction_below_workers.yaml": (
        "rendezvous.max_workers", 6, "0.95 of cluster.workers=10 is 9 (rounded down): must be >= "
    ),
    "per_worker_and_global_batch.yaml": (
        "workload.per_worker_batch", 6, "give either workload.per_worker_batch or workload.global_batch"
    ),
    "rate_and_mtbf.yaml": ("failures.per_1000_node_days", 4, "not both"),
    "lose_host_without_hosts.yaml": ("failures.schedule.0.lose_host", 7,
                                     "needs cluster.workers_per_host"),
    "lose_host_unknown_host.yaml": (
        "failures.schedule.1.lose_host", 11, "host 3 does not exist (hosts are 0..2: worker ids 0..9"
    ),
    "hosts_not_filled.yaml": ("cluster.workers_per_host", 4, "cluster.workers=6 does not fill hosts of 4"),
    "rack_not_whole_hosts.yaml": ("cluster.rack_size", 5, "must be a multiple of cluster.workers_per_host=4"),
}

SUBPROCESS_CASES = [
    "wrong_type_workers.yaml",
    "bad_yaml_syntax.yaml",
    "empty.yaml",
    "kill_unknown_worker.yaml",
    "pause_without_for_s.yaml",
]


def _check(path: Path, err: str, field: str, line: int | None, fragment: str) -> None:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    msg = lines[0]
    assert msg.startswith(f"rollcall: {path}: "), msg
    assert f": {field} " in msg or f": {field}:" in msg, msg
    if line is not None:
        assert f"(line {line})" in msg, msg
    assert fragment in msg, msg


def test_every_bad_file_has_a_case() -> None:
    on_disk = {p.name for p in BAD.glob("*.yaml")}
    assert on_disk == set(CASES)
    assert len(on_disk) >= 22


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_scenario_in_process(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = BAD / name
    assert cli.main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _check(path, err, *CASES[name])


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_scenario_subprocess(name: str) -> None:
    path = BAD / name
    proc = subprocess.run(
        [sys.executable, "-m", "rollcall", "validate", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    _check(path, proc.stderr, *CASES[name])


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"rollcall: {path}: no such file"]


def test_bad_set_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "scenarios" / "quickstart.yaml"
    assert cli.main(["validate", str(path), "--set", "cluster.workers"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "expected dotted.key=value" in err and "cluster.workers" in err


def test_bad_set_value_names_its_origin(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "scenarios" / "quickstart.yaml"
    assert cli.main(["validate", str(path), "--set", "cluster.workers=four"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"rollcall: {path}: cluster.workers (from --set): expected an integer, got 'four'"
    ]


def test_bad_seed_flag_names_its_origin(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "scenarios" / "quickstart.yaml"
    assert cli.main(["run", str(path), "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"rollcall: {path}: seed (from --seed): must be >= 0, got -1"]


def test_all_problems_are_kept() -> None:
    from rollcall.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: x\ncluster:\n  workers: 0\n  spares: -1\n", "f.yaml")
    assert len(info.value.problems) == 2
    assert all("\n" not in p for p in info.value.problems)
    assert str(info.value) == info.value.problems[0]
    assert info.value.field == "cluster.workers" and info.value.line == 3
