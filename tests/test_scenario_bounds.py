"""Hostile or absurd scenario input: one clean line and exit 2, quickly, never a traceback.

The hostile files (an alias bomb, 10,000-deep nesting, an alias cycle, a file
over 1 MiB, ``/dev/zero``, a FIFO nobody writes to) go through a real
``python -m rollcall validate`` subprocess, as a person would meet them; the
subprocess timeout is generous (it only bounds a hang, it asserts no speed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollcall.app import cli
from rollcall.scenario import (
    MAX_ALIAS_NODES, MAX_EXTRA_JOINS, MAX_NESTING, MAX_SCENARIO_BYTES, ScenarioError, parse_scenario,
)

ROOT = Path(__file__).resolve().parent.parent


def _bomb(levels: int = 9) -> str:
    lines = ["name: bomb", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for i in range(levels):
        name = f"l{i}"
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "\n".join(lines) + "\n"


def _alias_chain(links: int = 30, depth: int = 40) -> str:
    """Each anchor nests the previous alias ``depth`` deep: small, shallow per node, deep in all."""
    lines = ["name: chain", "a0: &a0 " + "[" * depth + "1" + "]" * depth]
    for i in range(1, links):
        lines.append(f"a{i}: &a{i} " + "[" * depth + f"*a{i - 1}" + "]" * depth)
    return "\n".join(lines) + "\n"


HOSTILE: dict[str, tuple[str, str]] = {
    "bomb.yaml": (_bomb(), "an alias bomb?"),
    "deep_list.yaml": ("name: deep\nx: " + "[" * 10_000 + "]" * 10_000 + "\n",
                       f"nested deeper than {MAX_NESTING} levels"),
    "deep_map.yaml": ("name: deep\nx: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n",
                      f"nested deeper than {MAX_NESTING} levels"),
    "cycle.yaml": ("name: c\nx: &a [1, *a]\n", "refers to the structure that contains it"),
    "chain.yaml": (_alias_chain(), f"aliases nest the data deeper than {MAX_NESTING} levels"),
    "huge.yaml": ("name: huge\ndescription: '" + "x" * MAX_SCENARIO_BYTES + "'\n",
                  "larger than 1048576 bytes (1 MiB)"),
}


def _validate(path: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollcall", "validate", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def _one_line(proc: subprocess.CompletedProcess[str], path: Path | str, fragment: str) -> None:
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[:2000]
    assert lines[0].startswith(f"rollcall: {path}: "), lines[0]
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_subprocess(name: str, tmp_path: Path) -> None:
    text, fragment = HOSTILE[name]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    _one_line(_validate(path), path, fragment)


def test_dev_zero_is_refused_not_read() -> None:
    _one_line(_validate("/dev/zero"), "/dev/zero", "not a regular file")


def test_fifo_without_writer_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)
    _one_line(_validate(fifo), fifo, "not a regular file")


def test_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rollcall: {tmp_path}: is a directory, expected a scenario file"]


def test_file_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    head = "name: edge\ndescription: '"
    text = head + "x" * (MAX_SCENARIO_BYTES - len(head) - 2) + "'\n"
    assert len(text.encode()) == MAX_SCENARIO_BYTES
    path = tmp_path / "edge.yaml"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["validate", str(path)]) == 0


def test_parse_scenario_text_is_capped_too() -> None:
    with pytest.raises(ScenarioError, match="larger than"):
        parse_scenario("name: x\n#" + "x" * MAX_SCENARIO_BYTES)


def test_ordinary_anchors_still_work() -> None:
    text = ("name: anchors\nfailures:\n  schedule:\n"
            "    - &k {at_s: 1.0, kill: 1}\n    - {at_s: 2.0, kill: 2}\n"
            "cluster: &c {workers: 4}\n")
    sc = parse_scenario(text)
    assert sc.failures.schedule[0].kill == 1 and sc.cluster.workers == 4


def test_alias_budget_counts_expansion_not_aliases() -> None:
    # 9 * 9**3 = 6561 expanded nodes: inside the budget, so the scenario check
    # (unknown key 'a') speaks; 9**6 is not
    with pytest.raises(ScenarioError) as info:
        parse_scenario(_bomb(levels=3))
    assert info.value.field == "a" and "unknown key" in info.value.message
    with pytest.raises(ScenarioError, match=f"at most {MAX_ALIAS_NODES}"):
        parse_scenario(_bomb(levels=6))


def test_duplicate_keys_inside_an_alias_are_still_found() -> None:
    text = "name: d\nx: &m {a: 1, a: 2}\ny: [*m, *m]\n"
    with pytest.raises(ScenarioError, match="duplicate key"):
        parse_scenario(text)


def test_nesting_just_under_the_limit_is_fine_for_yaml() -> None:
    # MAX_NESTING levels (the top mapping, then lists, then a scalar) parse;
    # the scenario check then rejects the unknown key, not the depth
    inner = MAX_NESTING - 2
    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: n\nx: " + "[" * inner + "1" + "]" * inner + "\n")
    assert info.value.field == "x" and "unknown key" in info.value.message


# ------------------------------------------------------------------ meaningless scenarios


@pytest.mark.parametrize("name", ["..", "."])
def test_name_that_leaves_runs_is_an_error(name: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(f"name: '{name}'\n", "n.yaml")
    assert info.value.field == "name" and "would leave runs/" in str(info.value)


def test_name_with_a_slash_is_an_error() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: a/../../b\n", "n.yaml")
    assert info.value.field == "name"


def test_dataset_smaller_than_one_batch_is_an_error() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: d\nworkload: {dataset_samples: 10, global_batch: 64}\n", "d.yaml")
    assert info.value.field == "workload.dataset_samples" and info.value.line == 2
    assert "must be >= workload.global_batch=64 (one batch), got 10" in str(info.value)
    assert parse_scenario("name: d\nworkload: {dataset_samples: 64, global_batch: 64}\n")


def test_joins_beyond_max_workers_plus_the_bound_are_an_error() -> None:
    base = "name: j\ncluster: {workers: 4}\nfailures:\n  schedule:\n    - {at_s: 1, join: %d}\n"
    assert parse_scenario(base % (4 + MAX_EXTRA_JOINS)).worker_id_limit == 8 + MAX_EXTRA_JOINS
    with pytest.raises(ScenarioError) as info:
        parse_scenario(base % 1_000_000, "j.yaml")
    assert info.value.field == "failures.schedule.0.join" and info.value.line == 5
    assert "more than rendezvous.max_workers=4 + 1000" in str(info.value)


def test_too_many_worker_ids_is_an_error() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: w\ncluster: {workers: 2000000}\n")
    assert info.value.field == "cluster.workers" and "more than 1000000" in str(info.value)


def test_fault_that_can_never_fire_is_a_warning(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("name: f\nworkload: {steps: 100}\nfailures:\n  schedule:\n"
                    "    - {at_step: 50, kill: 1}\n    - {at_step: 100000, kill: 2}\n")
    sc = parse_scenario(path.read_text())
    assert [f for f, _ in sc.warnings()] == ["failures.schedule.1.at_step"]
    assert cli.main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"rollcall: warning: {path}: failures.schedule.1.at_step: the job ends at step "
        f"workload.steps=100, so this fault at step 100000 never fires"]
    assert out.startswith("ok: f")


def test_set_values_are_bounded_like_files(capsys: pytest.CaptureFixture[str]) -> None:
    quick = str(ROOT / "scenarios" / "quickstart.yaml")
    bomb = "[" + ",".join(["*a"] * 9) + "]"
    value = "{a: &a [1,1,1,1,1,1,1,1,1], " + ", ".join(
        f"b{i}: &b{i} " + bomb.replace("*a", f"*{'a' if i == 0 else f'b{i - 1}'}") for i in range(8)) + "}"
    assert cli.main(["validate", quick, "--set", f"description={value}"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "an alias bomb?" in err and quick in err
    assert cli.main(["validate", quick, "--set", "description=" + "[" * 100 + "]" * 100]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"nested deeper than {MAX_NESTING}" in err
