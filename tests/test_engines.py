"""Engines (rollcall.app.engines): the same rows wherever the runs execute; a
lost task is run again, a failing one is not; nothing is left behind.

The Ray tests start one local head of their own (about 5 s), in a network
namespace of its own; the Slurm engine is exercised through submitit's
local stand-in (no Slurm here), which runs the same job arrays as local
processes. The task functions live in tests/engine_tasks.py, which the
worker processes import by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import psutil
import pytest

from rollcall.app import sweeps as sweep
from rollcall.app.engines import EngineError, open_engine
from rollcall.app.engines.local import LocalEngine

from polling import pid_running

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"
GRID = {"cluster.workers": [4, 6]}
#: wall-clock columns differ between any two runs, wherever they ran
WALL = ("wall_s", "check_wall_s", "keeper_wall_s", "sim_per_wall")


@pytest.fixture(autouse=True)
def _tasks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes (forked, spawned by Ray or by submitit) find tests/engine_tasks.py."""
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [here, str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    monkeypatch.syspath_prepend(here)


def _collect(engine: Any, fn: str, payloads: list[dict[str, Any]]) -> tuple[dict[int, Any], Any]:
    """Every result the engine delivered, and the EngineError it ended with (or None)."""
    got: dict[int, Any] = {}

    def done(i: int, result: dict[str, Any]) -> None:
        assert i not in got, f"task {i} delivered twice"
        got[i] = result["value"]

    try:
        engine.map(fn, payloads, done)
    except EngineError as exc:
        return got, exc
    return got, None


def _rows(out: Path) -> pd.DataFrame:
    df = pd.read_csv(out / sweep.CSV_FILE)
    return df.drop(columns=[c for c in WALL if c in df.columns]).sort_values("run_dir",
                                                                              ignore_index=True)


@pytest.fixture(scope="module")
def here_rows(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The grid run in this process, one point after the other: the reference."""
    out = tmp_path_factory.mktemp("here")
    sweep.sweep(QUICK, GRID, seeds=2, out=out, jobs=1, progress=False)
    return _rows(out)


def _same_rows(engine: Any, out: Path, here_rows: pd.DataFrame) -> None:
    df = sweep.sweep(QUICK, GRID, seeds=2, out=out, progress=False, engine=engine)
    assert len(df) == 8
    pd.testing.assert_frame_equal(_rows(out), here_rows)
    assert not list(out.rglob("*.part")), "a half-written point was left"


# -- local -------------------------------------------------------------------------------

def test_local_pool_gives_the_rows_of_a_run_here(tmp_path: Path, here_rows: pd.DataFrame) -> None:
    engine = LocalEngine(jobs=2)
    try:
        _same_rows(engine, tmp_path, here_rows)
    finally:
        engine.close()


def test_local_pool_runs_a_lost_task_again_and_delivers_each_once(tmp_path: Path) -> None:
    payloads = [{"value": i} for i in range(6)]
    payloads[3]["marker"] = str(tmp_path / "lost-3")
    engine = LocalEngine(jobs=2, retries=1)
    try:
        got, err = _collect(engine, "engine_tasks:lost_once", payloads)
    finally:
        engine.close()
    assert err is None and got == {i: 2 * i for i in range(6)}
    assert (tmp_path / "lost-3").exists()


def test_local_pool_gives_up_on_a_task_lost_more_than_retries(tmp_path: Path) -> None:
    engine = LocalEngine(jobs=1, retries=0)
    try:
        got, err = _collect(engine, "engine_tasks:lost_once",
                            [{"value": 1, "marker": str(tmp_path / "m")}])
    finally:
        engine.close()
    assert got == {} and "lost" in str(err) and "\n" not in str(err)


def test_a_task_that_raises_is_not_retried_and_the_others_are_kept() -> None:
    engine = LocalEngine(jobs=2, retries=2)
    try:
        got, err = _collect(engine, "engine_tasks:raises",
                            [{"value": 1}, {"value": 2, "bad": True}, {"value": 3}])
    finally:
        engine.close()
    assert got == {0: 2, 2: 6}
    assert "task 1" in str(err) and "point 2 is bad" in str(err)


def test_a_point_from_elsewhere_with_a_bad_file_name_is_refused(tmp_path: Path) -> None:
    point = sweep.Point({}, "elastic", 0)
    files = {"summary.json": "{}", "scenario.yaml": "x", "../escape": "no"}
    with pytest.raises(ValueError, match="names a file"):
        sweep.store_point(tmp_path, point, "0" * 64, {"files": files})
    with pytest.raises(ValueError, match="holds no run"):
        sweep.store_point(tmp_path, point, "0" * 64, {"files": {"history.jsonl": ""}})
    with pytest.raises(ValueError, match="elsewhere"):
        sweep.store_point(tmp_path, point, "0" * 64, {"run_dir": str(tmp_path)})
    assert not (tmp_path / "escape").exists() and not (tmp_path / point.rel_dir).exists()


# -- Ray ---------------------------------------------------------------------------------

def _ray_problem() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed"
    from rollcall.app.engines.ray_engine import namespace_prefix

    try:
        namespace_prefix()
    except EngineError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def ray_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    problem = _ray_problem()
    if problem is not None:
        pytest.skip(problem)
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([here, str(ROOT)] + ([old] if old else []))
    log = tmp_path_factory.mktemp("ray") / "engine.log"
    try:
        engine = open_engine("ray", jobs=2, log_path=str(log), retries=1)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    tree = psutil.Process(engine._proc.pid).children(recursive=True) + \
        [psutil.Process(engine._proc.pid)]
    yield engine
    engine.close()
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"left behind: {[p.pid for p in alive]}"


def test_ray_gives_the_rows_of_a_run_here(ray_engine: Any, tmp_path: Path,
                                          here_rows: pd.DataFrame) -> None:
    _same_rows(ray_engine, tmp_path, here_rows)


def test_ray_head_listens_on_loopback_in_a_namespace_of_its_own(ray_engine: Any) -> None:
    host = ray_engine._proc.pid
    assert os.readlink(f"/proc/{host}/ns/net") != os.readlink("/proc/self/ns/net")
    if os.geteuid() != 0 or shutil.which("nsenter") is None or shutil.which("ss") is None:
        pytest.skip("reading the namespace's sockets needs root, nsenter and ss")
    listing = subprocess.run(["nsenter", f"--net=/proc/{host}/ns/net", "ss", "-Hltn"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    local = [line.split()[3] for line in listing.splitlines() if line.strip()]
    assert local, "the head listens on nothing?"
    assert all(a.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]") for a in local), local


def test_ray_runs_a_lost_task_again_and_delivers_each_once(ray_engine: Any, tmp_path: Path) -> None:
    payloads = [{"value": i} for i in range(4)]
    payloads[2]["marker"] = str(tmp_path / "lost-2")
    got, err = _collect(ray_engine, "engine_tasks:lost_once", payloads)
    assert err is None and got == {i: 2 * i for i in range(4)}
    assert (tmp_path / "lost-2").exists()


def test_ray_reports_a_failing_task_after_the_others(ray_engine: Any) -> None:
    got, err = _collect(ray_engine, "engine_tasks:raises",
                        [{"value": 1, "bad": True}, {"value": 2}])
    assert got == {1: 4}
    assert "task 0" in str(err) and "point 1 is bad" in str(err) and "\n" not in str(err)


# -- Slurm (submitit's local stand-in) ----------------------------------------------------

def test_slurm_engine_gives_the_same_rows_and_reruns_a_lost_job(
        tmp_path: Path, here_rows: pd.DataFrame) -> None:
    pytest.importorskip("submitit")
    from rollcall.app.engines.slurm import SlurmEngine

    engine = SlurmEngine(folder=str(tmp_path / "jobs"), options={"timeout_min": 10},
                         retries=1, cluster="local")
    _same_rows(engine, tmp_path / "sweep", here_rows)
    got, err = _collect(engine, "engine_tasks:lost_once",
                        [{"value": 5, "marker": str(tmp_path / "lost")}, {"value": 6}])
    assert err is None and got == {0: 10, 1: 12}


# -- the command line ---------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--engine", "ray", "--address", "127.0.0.1:1"], "token authentication"),
    (["--engine", "slurm"], "sbatch"),
    (["--engine", "local", "--address", "x:1"], "--address"),
    (["--engine", "ray", "--engine-opt", "a=1"], "--engine-opt goes with --engine slurm"),
    (["--engine", "ray", "--target", "real", "--jobs", "1"], "engines run sim runs"),
    (["--engine", "slurm", "--engine-opt", "mem_gb=[2"], "the value is not YAML"),
])
def test_cli_engine_bad_input(args: list[str], says: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin")
    if "slurm" in args and "--engine-opt" not in args and shutil.which("sbatch"):
        pytest.skip("this machine has Slurm")
    scenario = ROOT / "scenarios" / ("real-kill-one.yaml" if "real" in args else "quickstart.yaml")
    proc = subprocess.run([sys.executable, "-m", "rollcall", "sweep", str(scenario), "--seeds", "1",
                           "--out", str(tmp_path / "o"), "--quiet"] + args,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_compare_through_the_local_engine(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rollcall", "compare", str(QUICK), "--seeds", "2",
                           "--engine", "local", "--out", str(tmp_path / "c"), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    here = subprocess.run([sys.executable, "-m", "rollcall", "compare", str(QUICK), "--seeds", "2",
                           "--out", str(tmp_path / "h"), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert here.returncode == 0, here.stderr
    a = pd.read_csv(tmp_path / "c" / "compare.csv").drop(columns=["run_dir", "wall_s"])
    b = pd.read_csv(tmp_path / "h" / "compare.csv").drop(columns=["run_dir", "wall_s"])
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_interrupted_ray_sweep_leaves_nothing_running_and_resumes(tmp_path: Path) -> None:
    """Ctrl-C while the Ray head works: exit 130, every process the sweep
    started (the Ray host, its head, its workers) gone, the finished points
    kept whole; the same command then runs the rest."""
    problem = _ray_problem()
    if problem is not None:
        pytest.skip(problem)
    from polling import signal_when

    out = tmp_path / "sweep"
    cmd = ["sweep", str(ROOT / "scenarios" / "llama3-54d.yaml"), "--grid",
           "failures.worker_mtbf_s=2e7,3e7", "--seeds", "3", "--engine", "ray", "--jobs", "2",
           "--out", str(out), "--quiet"]

    def finished() -> list[Path]:  # a point cut short stays in its staging dir (.part)
        return [p.parent for p in out.rglob("summary.json") if p.parent.name.startswith("seed")
                and not p.parent.name.endswith(".part")]

    def one_point_done(_: psutil.Process) -> bool:
        return bool(finished())

    rc, err, _, seen = signal_when(cmd, tmp_path, signal.SIGINT, one_point_done,
                                   "a point written by the Ray engine")
    assert rc == 130, err
    assert "Traceback" not in err and "finished runs kept" in err, err
    assert seen, "no process was started?"
    assert not [pid for pid in seen if pid_running(pid)], "left running"
    assert finished()
    again = subprocess.run([sys.executable, "-m", "rollcall", *cmd], capture_output=True,
                           text=True, timeout=400, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(pd.read_csv(out / sweep.CSV_FILE)) == 12 and len(finished()) == 12
    assert not list(out.rglob("*.part")), "a point's staging dir was left"


_CLUSTER = r'''
"""Inside a network namespace of the test's own: a Ray head as a user runs
one (token authentication), then the sweep joins it with --address."""
import os, signal, socket, subprocess, sys, time
import psutil
from pyroute2 import IPRoute
from rollcall.app.engines.local import end_processes

with IPRoute() as ipr:
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
print(os.readlink("/proc/self/ns/net"), flush=True)
ray, out, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
head = subprocess.Popen([ray, "start", "--head", "--block", "--port", "6390",
                         "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
                         "--include-dashboard", "false", "--disable-usage-stats",
                         "--temp-dir", tmp], start_new_session=True,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 180
    while True:  # bounded: the head's GCS port answers
        try:
            socket.create_connection(("127.0.0.1", 6390), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or head.poll() is not None:
                sys.exit("the Ray head did not start")
            time.sleep(0.2)
    rc = subprocess.run([sys.executable, "-m", "rollcall", "sweep", sys.argv[4], "--grid",
                         "cluster.workers=4,6", "--seeds", "2", "--engine", "ray",
                         "--address", "127.0.0.1:6390", "--out", out, "--quiet"]).returncode
finally:  # the head is ours, and so is every process in this namespace
    end_processes([psutil.Process(head.pid)], timeout_s=10.0)
    head.wait(timeout=60)
    me, mine = os.getpid(), os.readlink("/proc/self/ns/net")
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]:
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == mine:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
sys.exit(rc)
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_joins_a_token_authenticated_ray_cluster_by_address(
        tmp_path: Path, here_rows: pd.DataFrame) -> None:
    """``--address``: the cluster is the user's (here a head started in a
    namespace of the test's own, with a token); the rows are those of a run
    here, and nothing of the head outlives it."""
    problem = _ray_problem()
    if problem is not None:
        pytest.skip(problem)
    if os.geteuid() != 0:
        pytest.skip("starting a Ray head in a network namespace of the test's own needs root")
    script = tmp_path / "cluster.py"
    script.write_text(_CLUSTER, encoding="utf-8")
    ray = str(Path(sys.executable).with_name("ray"))
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="t" * 32,
               RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    import tempfile

    temp = tempfile.mkdtemp(prefix="rc-ray-", dir="/tmp")  # Ray's socket paths must be short
    try:
        proc = subprocess.run(["unshare", "--net", sys.executable, str(script), ray,
                               str(tmp_path / "sweep"), temp, str(QUICK)],
                              capture_output=True, text=True, timeout=500, env=env)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    netns = proc.stdout.splitlines()[0]
    pd.testing.assert_frame_equal(_rows(tmp_path / "sweep"), here_rows)
    from rollcall.app.engines.ray_engine import _in_netns

    left = _in_netns(netns)
    assert not left, [p.pid for p in left]
