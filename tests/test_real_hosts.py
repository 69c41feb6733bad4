"""The real target's hosts: network namespaces with host agents.

A scenario with ``cluster.workers_per_host`` runs each host as a network
namespace on a bridge, with one host agent (real/host.py) inside that starts
and reaps the host's workers; the keeper service and the TCPStore listen on
the bridge's address and gloo runs over the hosts' own addresses. A lost host
loses its link and every process at once, so nothing reports an exit and
only the detector sees it. ``rollcall keeper`` + ``rollcall host`` are the
same two pieces run apart, tested here with namespaces standing in for the
machines. After every test nothing of the run is left: no namespace, no
link, no process.

These need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and nftables; elsewhere
they skip with netns_available()'s reason. CI runs as root, so CI runs them.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from real.netns import NETNS_DIR, Network, netns_available
from rollcall.app import cli
from rollcall.results import read_history, read_summary
from rollcall.scenario import Scenario, load_scenario
from polling import pid_running, signal_when, wait_for
from real_processes import REAL_PROCESSES

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
REASON = netns_available()
needs_netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")
pytestmark = REAL_PROCESSES
SMALL = ["failures.schedule=[]", "workload.steps=12"]  # real-lose-host without its fault


def lose_host(*overrides: str) -> Scenario:
    return load_scenario(SCENARIOS / "real-lose-host.yaml", list(overrides))


def ours(out: Path) -> list[psutil.Process]:
    """Every process that names this run's directory (workers: --run-dir; host
    agents: --token-file under it), wherever it was started from."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and str(out) in " ".join(p.info["cmdline"] or ()):
                found.append(p)
        except psutil.Error:
            continue
    return [p for p in found if pid_running(p.pid)]


def names_with(prefix: str) -> list[str]:
    from pyroute2 import IPRoute

    with IPRoute() as ip:
        links = [l.get_attr("IFLA_IFNAME") for l in ip.get_links()]
    spaces = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
    return [n for n in links + spaces if n.startswith(prefix)]


def assert_nothing_left(out: Path, summary: dict[str, Any]) -> None:
    """No namespace, link or process of the run outlived it."""
    prefix = json.loads((out / "real" / "network.json").read_text())["prefix"]
    assert names_with(prefix) == []
    pids = [p["pid"] for p in summary["processes"] if p["pid"] is not None]
    assert pids and not [pid for pid in pids if pid_running(pid)]
    assert ours(out) == []
    assert not (out / "real" / "secret").exists()


def records(out: Path) -> list[dict]:
    return list(read_history(out))


def member_ids(r: dict) -> list[int]:
    return [w for lo, hi in r["members"] for w in range(lo, hi + 1)]


@needs_netns
@pytest.mark.timeout(180)
def test_a_small_hosts_run_completes_valid_in_namespaces(tmp_path: Path) -> None:
    from real import driver

    out = tmp_path / "run"
    summary = driver.run(lose_host(*SMALL), out)
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["samples_duplicated"] == 0 and summary["samples_skipped"] == 0
    assert summary["steps_committed"] == 12
    net = json.loads((out / "real" / "network.json").read_text())
    assert net["hosts"] == 2
    # every worker was started by its host's agent (its pid came from there)
    assert sorted(p["worker"] for p in summary["processes"]) == [0, 1, 2, 3]
    assert all(p["pid"] is not None for p in summary["processes"])
    assert_nothing_left(out, summary)


@needs_netns
@pytest.mark.timeout(180)
def test_a_lost_host_is_seen_only_by_the_detector(tmp_path: Path) -> None:
    """lose_host: link down and both processes killed at once; no exit is
    reported, the keeper evicts both for silence, the survivors resume after
    the detector's timeout, and the run completes valid."""
    from real import driver

    out = tmp_path / "run"
    sc = lose_host()
    summary = driver.run(sc, out)
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["samples_duplicated"] == 0 and summary["samples_skipped"] == 0
    recs = records(out)
    (fault,) = [r for r in recs if r["f"] == "fault" and r["kind"] == "lose_host"]
    assert fault["host"] == 1 and fault["workers"] == [2, 3]
    assert [r for r in recs if r["f"] == "exit"] == []
    evicted = sorted((r["worker"], r["reason"]) for r in recs if r["f"] == "evict")
    assert evicted == [(2, "timeout"), (3, "timeout")]
    after = [r for r in recs if r["f"] == "generation" and r["t"] > fault["t"]]
    assert after and member_ids(after[0]) == [0, 1]
    first = min(r["t"] for r in recs if r["f"] == "commit" and r["gen"] == after[0]["gen"])
    # the silence must be waited out (less a heartbeat: the last beat came before the fault)
    assert first - fault["t"] >= sc.detector.timeout_s - sc.detector.heartbeat_s - 0.05
    lost = [p for p in summary["processes"] if p["worker"] in (2, 3)]
    assert [p["fault"] for p in lost] == ["crash", "crash"]
    assert_nothing_left(out, summary)


@needs_netns
@pytest.mark.timeout(180)
def test_a_killed_worker_s_exit_comes_from_its_host_agent(tmp_path: Path) -> None:
    """A kill in hosts mode goes through the host's agent, which reaps the
    process and reports the exit: the keeper evicts it ``exited``, as on the
    local pidfd path, and the survivors keep their processes."""
    from real import driver

    out = tmp_path / "run"
    summary = driver.run(load_scenario(SCENARIOS / "real-kill-one.yaml",
                                       ["cluster.workers_per_host=2"]), out)
    assert summary["completed"] and summary["valid"], summary["violations"]
    recs = records(out)
    assert [(r["worker"], r["reason"]) for r in recs if r["f"] == "evict"] == [(1, "exited")]
    (killed,) = [p for p in summary["processes"] if p["worker"] == 1]
    assert killed["fault"] == "kill" and killed["returncode"] == -signal.SIGKILL
    assert sorted(p["worker"] for p in summary["processes"] if p["fault"] is None) == [0, 2, 3]
    assert_nothing_left(out, summary)


@needs_netns
@pytest.mark.timeout(180)
def test_ctrl_c_removes_the_namespaces_and_every_process(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = ["run", str(SCENARIOS / "real-lose-host.yaml"), "--out", str(out),
           "--set", "workload.steps=100000", "--set", "failures.schedule=[]"]
    rc, err, _, seen = signal_when(
        cmd, ROOT, signal.SIGINT,
        lambda _: (out / "history.jsonl").exists() and sum(
            '"f":"commit"' in line for line in (out / "history.jsonl").read_text().splitlines()) >= 3,
        "three committed steps", exit_timeout_s=60)
    assert rc == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert seen and not [pid for pid in seen if pid_running(pid)]
    assert_nothing_left(out, read_summary(out))


# ``delay``: the one network fault ``rollcall keeper`` orders (the hosts'
# relays hold the keeper link back, real/relay.py): past the 1.5 s timeout.
# The job ends while host 1's backlog is still held (5 s): the keeper drains
# each worker's link before it stops (Launcher.drain), or the ledger would
# miss host 1's records.
DELAYED = ["failures.schedule=[{at_step: 5, delay: 1, latency_s: 5.0, for_s: 1.0}]",
           "workload.steps=12"]


@needs_netns
@pytest.mark.timeout(240)
@pytest.mark.parametrize("overrides", [SMALL, DELAYED], ids=["plain", "delay"])
def test_rollcall_keeper_and_rollcall_host_run_the_job(tmp_path: Path, overrides: list[str]) -> None:
    """The CLI pair: ``rollcall keeper`` on the bridge's address, one
    ``rollcall host`` per host inside its namespace; the run completes valid
    (with a delay on host 1's keeper link: its workers evicted for their
    silence, as in hosts mode)."""
    out = tmp_path / "run"
    scenario = SCENARIOS / "real-lose-host.yaml"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with Network("t-cli-pair", 2) as net:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "rollcall", "keeper", str(scenario), "--bind", net.keeper_address,
             "--out", str(out), *(a for s in overrides for a in ("--set", s))],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        hosts: list[subprocess.Popen] = []
        try:
            info_path = out / "real" / "keeper.json"
            wait_for(lambda: info_path.exists() or keeper.poll() is not None, 60, "keeper.json")
            info = json.loads(info_path.read_text())
            assert info["address"].startswith(net.keeper_address + ":")
            assert stat.S_IMODE(os.stat(info["token_file"]).st_mode) == 0o600
            secret = Path(info["token_file"]).read_bytes().hex()
            for h in range(2):
                hosts.append(net.spawn(h, [sys.executable, "-m", "rollcall", "host", "--keeper",
                                           info["address"], "--token-file", info["token_file"],
                                           "--host", str(h)],
                                       cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))
            assert not [p for p in hosts if secret in " ".join(psutil.Process(p.pid).cmdline())]
            stdout, stderr = keeper.communicate(timeout=180)
            assert keeper.returncode == 0, stderr[-2000:]
            assert f"listening on {info['address']}" in stdout
            for p in hosts:
                _, host_err = p.communicate(timeout=60)
                assert p.returncode == 0 and "Traceback" not in host_err, host_err[-2000:]
        finally:
            for p in [keeper, *hosts]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        summary = read_summary(out)
        assert summary["completed"] and summary["valid"], summary["violations"]
        assert summary["steps_committed"] == 12
        if overrides is DELAYED:
            history = list(read_history(out))
            assert [r["workers"] for r in history if r["f"] == "fault" and r["kind"] == "delay"] \
                == [[2, 3]]
            assert sorted((r["worker"], r["reason"]) for r in history if r["f"] == "evict") \
                == [(2, "timeout"), (3, "timeout")]
        assert ours(out) == []
        prefix = net.prefix
    assert names_with(prefix) == []


def one_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err


@pytest.mark.parametrize("argv, fragment", [
    (["host", "--keeper", "nowhere", "--token-file", "f", "--host", "0"], "expected ADDR:PORT"),
    (["host", "--keeper", "10.0.0.1:99999", "--token-file", "f", "--host", "0"], "ADDR:PORT"),
    (["host", "--keeper", "10.0.0.1:7", "--token-file", "f", "--host", "-1"], "host number"),
    (["keeper", "scenarios/real-lose-host.yaml", "--bind", "300.1.1.1", "--out", "x"], "IPv4"),
    (["keeper", "scenarios/real-lose-host.yaml", "--bind", "127.0.0.1:70000", "--out", "x"], "port"),
    (["keeper", "scenarios/real-lose-host.yaml", "--out", "x"], "--bind"),
])
def test_bad_flags_one_line_exit_2(argv: list[str], fragment: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    one_error(capsys, fragment)


def test_keeper_refuses_what_it_cannot_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    out = str(tmp_path / "k")
    # an address this machine does not hold (TEST-NET-3, never assigned)
    assert cli.main(["keeper", "scenarios/real-lose-host.yaml", "--bind", "203.0.113.7",
                     "--out", out]) == 2
    one_error(capsys, "cannot listen there")
    assert cli.main(["keeper", "scenarios/real-kill-one.yaml", "--bind", "127.0.0.1",
                     "--out", out]) == 2
    one_error(capsys, "needs hosts")
    assert not Path(out).exists()


def test_host_with_an_unreadable_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["host", "--keeper", "127.0.0.1:9", "--token-file", str(tmp_path / "none"),
                     "--host", "0"]) == 2
    one_error(capsys, "--token-file")
    (tmp_path / "short").write_bytes(b"abc")
    assert cli.main(["host", "--keeper", "127.0.0.1:9", "--token-file", str(tmp_path / "short"),
                     "--host", "0"]) == 2
    one_error(capsys, "not a run secret")


@needs_netns
def test_without_net_admin_a_hosts_scenario_is_refused(tmp_path: Path) -> None:
    """Root without CAP_NET_ADMIN (an unprivileged container): one line, exit 2, nothing run."""
    import ctypes
    import ctypes.util

    from test_netns import drop_net_admin

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "rollcall", "run", str(SCENARIOS / "real-lose-host.yaml"),
                        "--out", str(out)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       preexec_fn=drop_net_admin(libc), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "runs hosts as network namespaces" in err and "need root or CAP_NET_ADMIN" in err, err
    assert not out.exists()
