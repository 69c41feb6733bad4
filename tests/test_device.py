"""Real GPUs on a machine without one: what decides devices and NCCL, checked on CPU.

- the scenario keys ``cluster.device`` and ``cluster.backend``: defaults,
  the file-only rule (``nccl`` needs ``cuda``), bad values, one-line errors;
- the real target's run-time refusal of ``device: cuda`` when CUDA is absent
  (the CLI in a subprocess: exit 2, one line, no traceback, no run directory);
- :func:`real.device.pick_device` and :func:`real.device.device_problem`
  (worker id to GPU, GPUs per worker for ``nccl``), given a device count;
- :func:`real.device.worker_env` (the watchdog never tears a survivor down),
  checked against torch 2.13's own header where the wheel ships it;
- :class:`real.device.Communicators` (abort off the caller's thread, never
  destroy) and :func:`real.device.nccl_backend`'s call order, with fakes;
- the workload, reduction and ZeRO buffers follow the device asked for (the
  ``meta`` device stands in for a GPU: every tensor must land on it);
- a short CPU real run writes the new summary keys.

The GPU paths themselves are not exercised here: benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from real import device as dev
from rollcall.scenario import ScenarioError, load_scenario, parse_scenario
from real_processes import REAL_PROCESSES
from polling import pid_running

ROOT = Path(__file__).resolve().parent.parent
TORCH_DIR = Path(torch.__file__).resolve().parent
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def scenario_text(cluster: dict[str, Any], target: str = "real", **extra: Any) -> str:
    raw = {"name": "dev", "target": target, "cluster": {"workers": 2, **cluster},
           "workload": {"steps": 6, "global_batch": 8, "micro_batch": 2,
                        "dataset_samples": 64, "model_params": 2000},
           "detector": {"heartbeat_s": 0.1, "timeout_s": 2.0},
           "rendezvous": {"min_workers": 1, "last_call_s": 0.2, "join_timeout_s": 5.0},
           **extra}
    return yaml.safe_dump(raw, sort_keys=False)


def parse(cluster: dict[str, Any], target: str = "real", **extra: Any):
    return parse_scenario(scenario_text(cluster, target, **extra), "<dev>")


# --- the scenario keys --------------------------------------------------------------


def test_defaults_are_cpu_and_gloo() -> None:
    c = parse({}).cluster
    assert (c.device, c.backend) == ("cpu", "gloo")
    assert parse({}).to_dict()["cluster"]["device"] == "cpu"


@pytest.mark.parametrize("device,backend", [("cpu", "gloo"), ("cuda", "gloo"), ("cuda", "nccl")])
def test_every_valid_pair_parses_without_a_gpu(device: str, backend: str) -> None:
    # the machine's GPUs are a run-time question: parsing never asks
    c = parse({"device": device, "backend": backend}).cluster
    assert (c.device, c.backend) == (device, backend)


def test_nccl_without_cuda_is_refused_in_one_line() -> None:
    with pytest.raises(ScenarioError) as err:
        parse({"backend": "nccl"})
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("<dev>: cluster.backend (line "), msg
    assert "nccl needs cluster.device: cuda" in msg


@pytest.mark.parametrize("key,value,expected", [
    ("device", "gpu", "expected 'cpu' or 'cuda', got 'gpu'"),
    ("backend", "mpi", "expected 'gloo' or 'nccl', got 'mpi'"),
    ("device", 1, "expected 'cpu' or 'cuda'"),
])
def test_bad_values_are_refused_in_one_line(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse({key: value})
    msg = str(err.value)
    assert "\n" not in msg and f"cluster.{key} (line " in msg and expected in msg, msg


def test_an_override_that_makes_nccl_without_cuda_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(scenario_text({}))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path, ["cluster.backend=nccl"])
    assert "cluster.backend" in str(err.value) and "needs cluster.device: cuda" in str(err.value)


def test_the_sim_accepts_and_ignores_the_keys() -> None:
    sc = parse({"device": "cuda", "backend": "nccl"}, target="sim")
    assert dev.device_problem(sc, cuda_count=0) is None  # nothing to check on the sim


# --- the real target refuses cuda without CUDA ------------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollcall", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@NO_CUDA
@pytest.mark.parametrize("command", ["run", "compare"])
def test_real_run_of_cuda_without_cuda_exits_2_in_one_line(tmp_path: Path, command: str) -> None:
    path = tmp_path / "cuda.yaml"
    path.write_text(scenario_text({"device": "cuda"}))
    out = tmp_path / "out"
    proc = _cli(command, str(path), "--out", str(out), cwd=ROOT)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"rollcall: dev: cluster.device: cuda, but CUDA is not available on this "
                     f"machine (torch {torch.__version__}); use cluster.device: cpu"], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists(), "a refused run made its directory"


@NO_CUDA
def test_validate_of_a_cuda_scenario_needs_no_gpu(tmp_path: Path) -> None:
    path = tmp_path / "cuda.yaml"
    path.write_text(scenario_text({"device": "cuda", "backend": "nccl"}))
    proc = _cli("validate", str(path), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: dev (real, elastic)")


@NO_CUDA
def test_the_driver_itself_refuses_too(tmp_path: Path) -> None:
    from real import driver

    with pytest.raises(ValueError, match="CUDA is not available"):
        driver.run(parse({"device": "cuda"}), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- device selection -----------------------------------------------------------------


def test_cpu_is_cpu_whatever_the_gpus() -> None:
    assert {dev.pick_device(w, "cpu", "gloo", n) for w in range(5) for n in (0, 1, 8)} == {"cpu"}


def test_gloo_shares_the_gpus_round_robin() -> None:
    assert [dev.pick_device(w, "cuda", "gloo", 1) for w in range(4)] == ["cuda:0"] * 4
    assert [dev.pick_device(w, "cuda", "gloo", 2) for w in range(4)] == [
        "cuda:0", "cuda:1", "cuda:0", "cuda:1"]


def test_nccl_gives_each_worker_id_its_own_gpus() -> None:
    assert [dev.pick_device(w, "cuda", "nccl", 4) for w in range(4)] == [
        "cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [dev.pick_device(w, "cuda", "nccl", 4, gpus_per_worker=2) for w in range(2)] == [
        "cuda:0", "cuda:2"]
    with pytest.raises(ValueError, match="worker 2 needs GPUs 2..2"):
        dev.pick_device(2, "cuda", "nccl", 2)
    with pytest.raises(ValueError, match="worker 1 needs GPUs 2..3"):
        dev.pick_device(1, "cuda", "nccl", 3, gpus_per_worker=2)


def test_cuda_without_a_device_or_an_unknown_device_is_an_error() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        dev.pick_device(0, "cuda", "gloo", 0)
    with pytest.raises(ValueError, match="unknown device"):
        dev.pick_device(0, "tpu", "gloo", 1)


def test_device_problem_counts_every_worker_id_for_nccl() -> None:
    # 2 workers + 1 spare + 1 join: 4 ids, each its own GPU under nccl
    sc = parse({"device": "cuda", "backend": "nccl", "spares": 1},
               failures={"schedule": [{"at_step": 3, "join": 1}]})
    assert sc.worker_id_limit == 4
    assert dev.device_problem(sc, cuda_count=4) is None
    msg = dev.device_problem(sc, cuda_count=3)
    assert msg is not None and "\n" not in msg
    assert "needs one GPU per worker process (4 worker ids" in msg and "this machine has 3" in msg
    assert dev.gpus_needed(4, 2, "nccl") == 8 and dev.gpus_needed(4, 2, "gloo") == 1


def test_device_problem_on_a_machine_without_cuda() -> None:
    assert dev.device_problem(parse({}), cuda_count=0) is None  # cpu: nothing to check
    assert dev.device_problem(parse({"device": "cuda"}), cuda_count=1) is None  # gloo shares
    msg = dev.device_problem(parse({"device": "cuda"}), cuda_count=0)
    assert msg is not None and "CUDA is not available" in msg and "\n" not in msg


# --- the NCCL environment -----------------------------------------------------------


def test_the_cpu_environment_is_untouched() -> None:
    assert dev.worker_env("cpu", "gloo", 60.0) == {}


def test_cuda_with_gloo_sets_only_deterministic_cublas() -> None:
    assert dev.worker_env("cuda", "gloo", 60.0) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def test_nccl_environment_never_tears_a_survivor_down() -> None:
    env = dev.worker_env("cuda", "nccl", 60.0)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"  # clean up only
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] not in ("1", "3")  # the tearing-down modes
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "0"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert env["TORCH_NCCL_USE_COMM_NONBLOCKING"] == "1"
    assert env["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "60"
    assert dev.worker_env("cuda", "nccl", 0.4)["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "1"
    assert all(isinstance(v, str) for v in env.values())


NCCL_HEADER = (TORCH_DIR / "include" / "torch" / "csrc" / "distributed" / "c10d"
               / "ProcessGroupNCCL.hpp")


@pytest.mark.skipif(not NCCL_HEADER.exists(), reason="this torch wheel ships no c10d headers")
def test_the_modes_and_names_are_torchs_own() -> None:
    """The values and names above, read from the installed torch's header."""
    text = NCCL_HEADER.read_text()
    modes = dict((name, int(v)) for name, v in re.findall(r"(\w+) = (\d)", text.split(
        "enum ErrorHandlingMode", 1)[1].split("};", 1)[0]))
    assert modes == {"NoHandling": 0, "TearDown": 1, "CleanUpOnly": 2, "SkipCleanUp": 3}
    assert dev.ASYNC_ERROR_CLEANUP_ONLY == modes["CleanUpOnly"]
    assert "#define SHOULD_TEAR_DOWN(a) (a != NoHandling && a != CleanUpOnly)" in text
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ENABLE_MONITORING",
                 "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_PROPAGATE_ERROR",
                 "TORCH_NCCL_BLOCKING_WAIT"):
        assert f'"{name}"' in text, name
    assert "ncclConfig_t config" in text and "bool is_high_priority_stream" in text
    assert "void eagerConnectSingleDevice(at::Device device) override;" in text
    assert "void abort() override;" in text


def test_the_python_names_nccl_backend_uses_are_in_torchs_stub() -> None:
    """The compiled module's type stub (shipped with every torch build)
    declares what :func:`real.device.nccl_backend` calls."""
    stub = (TORCH_DIR / "_C" / "_distributed_c10d.pyi").read_text()
    nccl = stub.split("class ProcessGroupNCCL(Backend):", 1)[1].split("\nclass ", 1)[0]
    assert "blocking: int" in nccl and "config: ProcessGroupNCCL.NCCLConfig" in nccl
    assert "def __init__(self, is_high_priority_stream: bool = False)" in nccl
    assert "options: Options," in nccl and "def abort(self) -> None" in nccl
    backend = stub.split("class Backend:", 1)[1].split("\nclass ", 1)[0]
    assert "def eager_connect_single_device(self, device: torch.device | None)" in backend
    assert "def _timeout(self, val: timedelta)" in backend


# --- building and aborting NCCL groups, with fakes ---------------------------------------


class FakeDist:
    """Records what :func:`real.device.nccl_backend` does, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        outer = self

        class Config:
            blocking = -2147483648  # NCCL_CONFIG_UNDEF_INT

        class Options:
            def __init__(self, is_high_priority_stream: bool = False) -> None:
                self.is_high_priority_stream = is_high_priority_stream
                self.config = Config()
                self._timeout = None

        class ProcessGroupNCCL:
            def __init__(self, store: Any, rank: int, size: int, opts: Any) -> None:
                self.opts = opts
                outer.calls.append(("new", store, rank, size, opts.config.blocking, opts._timeout))

            def eager_connect_single_device(self, device: Any) -> None:
                outer.calls.append(("connect", device))

        ProcessGroupNCCL.Options = Options  # type: ignore[attr-defined]
        self.ProcessGroupNCCL = ProcessGroupNCCL


def test_nccl_backend_is_non_blocking_and_abortable_before_it_connects() -> None:
    from datetime import timedelta

    fake = FakeDist()
    heard: list[Any] = []
    backend = dev.nccl_backend(fake, "store", 1, 3, "cuda:1", 60.0,
                               lambda b: (heard.append(b), fake.calls.append(("registered",))))
    assert fake.calls == [("new", "store", 1, 3, 0, timedelta(seconds=60)), ("registered",),
                          ("connect", "cuda:1")]
    assert heard == [backend] and backend.opts.is_high_priority_stream is False


class Backends:
    """Fake backends whose abort can be held, to show it never blocks the caller."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.release = threading.Event()
        self.hold: set[str] = set()

    def abort(self, name: str) -> None:
        if name in self.hold:
            self.release.wait(30)
        if name == "bad":
            raise RuntimeError("NCCL communicator was aborted")
        self.aborted.append(name)


def test_communicators_abort_every_generation_through_the_one_that_ended() -> None:
    b = Backends()
    comms = dev.Communicators(abort=b.abort)
    try:
        comms.add(1, "g1")
        comms.add(2, "g2a")
        comms.add(2, "g2b")
        comms.add(3, "g3")
        comms.abort_through(2)
        assert comms.wait_idle(10)
        assert b.aborted == ["g1", "g2a", "g2b"]
        comms.add(2, "late")  # built after its generation ended: aborted at once
        comms.abort_through(1)  # an older end changes nothing
        assert comms.wait_idle(10)
        assert b.aborted == ["g1", "g2a", "g2b", "late"]
        assert comms.graveyard == ["g1", "g2a", "g2b", "late"]  # kept: never destroyed
        assert list(comms.live) == [3]
    finally:
        comms.close()


def test_a_blocked_or_failing_abort_never_holds_the_caller() -> None:
    b = Backends()
    b.hold.add("stuck")
    comms = dev.Communicators(abort=b.abort)
    try:
        comms.add(1, "stuck")
        comms.add(2, "bad")
        comms.add(3, "g3")
        comms.abort_through(3)  # returns while "stuck" is still aborting
        assert not comms.wait_idle(0.05)
        b.release.set()
        assert comms.wait_idle(10)
        assert b.aborted == ["stuck", "g3"]
        assert comms.errors == ["RuntimeError: NCCL communicator was aborted"]
        assert comms.graveyard == ["stuck", "bad", "g3"]
    finally:
        b.release.set()
        comms.close()


# --- tensors follow the device ----------------------------------------------------------


def test_workload_reduction_and_zero_buffers_land_on_the_device_asked() -> None:
    from real import reduce
    from real.model import Workload
    from real.zero import gather_buffer

    wl = Workload(3, 2000, 0.05, device="meta")  # "meta" stands in for a GPU here
    tensors = {"flat": wl.flat, "initial": wl.initial, "grad_buf": wl.grad_buf,
               "momentum": wl.momentum, "teacher": wl.teacher, "state": wl.state(),
               "initial_state": wl.initial_state(), "batch": wl.batch([1, 2])[0],
               **{f"param{i}": p for i, p in enumerate(wl.params)},
               **{f"grad{i}": p.grad for i, p in enumerate(wl.params)}}
    assert {k: t.device.type for k, t in tensors.items()} == {k: "meta" for k in tensors}
    assert reduce.ExactPart(wl.n, 4, None, device="meta").payload.device.type == "meta"
    assert reduce.fast_payload(wl.grad_buf, [0.5]).device.type == "meta"
    assert gather_buffer(wl.n, "meta").device.type == "meta"


def test_on_the_cpu_the_workload_is_the_one_it_was() -> None:
    """Same initial bits, same data, same step, same hash with and without the device."""
    from real.model import Workload

    a, b = Workload(5, 3000, 0.05), Workload(5, 3000, 0.05, device=torch.device("cpu"))
    for wl in (a, b):
        wl.zero_grad()
        loss = wl.accumulate([3, 4, 5, 6])
        wl.apply(wl.flat_grad(), 1.0)
        assert loss > 0
    assert a.weights_sha256() == b.weights_sha256()
    assert torch.equal(a.state(), b.state())


def test_a_checkpoint_is_written_from_the_cpu_and_loads_where_asked(tmp_path: Path) -> None:
    from real.model import load_checkpoint, save_checkpoint

    state = torch.arange(6, dtype=torch.float32)
    save_checkpoint(tmp_path, 4, 32, state)
    plain = load_checkpoint(tmp_path, 4)
    there = load_checkpoint(tmp_path, 4, map_location="meta")
    assert plain is not None and there is not None
    assert torch.equal(plain["state"], state) and plain["state"].device.type == "cpu"
    assert there["state"].device.type == "meta" and (there["step"], there["sample"]) == (4, 32)
    assert load_checkpoint(tmp_path, 5) is None


def test_the_platform_keys_say_what_ran() -> None:
    keys = dev.platform_keys("cpu", "gloo")
    assert keys == {"torch_version": torch.__version__, "backend": "gloo", "device": "cpu",
                    "nccl_version": None}
    nccl = dev.platform_keys("cuda", "nccl")["nccl_version"]
    assert nccl is None if not torch.cuda.is_available() else isinstance(nccl, str)


# --- a CPU real run ----------------------------------------------------------------------


def real_processes(fn: Any) -> Any:
    """The marks of every test that starts real worker processes (one run at a time)."""
    for mark in REAL_PROCESSES:
        fn = mark(fn)
    return fn


@real_processes
@pytest.mark.timeout(180)
def test_a_cpu_real_run_records_what_it_ran_on(tmp_path: Path) -> None:
    from real import driver
    from rollcall.results import read_summary

    sc = parse({})
    summary = driver.run(sc, tmp_path)
    assert summary["completed"] is True, summary["end_reason"]
    assert summary["valid"] is True, summary["violations"]
    assert summary["steps_committed"] == sc.workload.steps
    got = {k: summary[k] for k in ("torch_version", "backend", "device", "nccl_version")}
    assert got == {"torch_version": torch.__version__, "backend": "gloo", "device": "cpu",
                   "nccl_version": None}
    assert {k: read_summary(tmp_path)[k] for k in got} == got
    assert not [p["pid"] for p in summary["processes"] if pid_running(p["pid"])]


@pytest.mark.slow
@real_processes
@pytest.mark.timeout(300)
def test_the_gpu_check_harness_passes_rehearsed_on_the_cpu() -> None:
    """``benchmarks/gpu_check.sh --rehearse-on-cpu 1``: the one-GPU checks'
    harness on the CPU over gloo (not the GPU paths, which only a GPU
    machine runs), so that the prepared check still works when one is lent."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["bash", str(root / "benchmarks" / "gpu_check.sh"), "--rehearse-on-cpu",
                          "1"], cwd=root, capture_output=True, text=True, timeout=280)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    passed = [line for line in lines if line.startswith("PASS ")]
    assert len(passed) == 7 and not [line for line in lines if line.startswith("FAIL ")], lines
