"""Long-lived real workers keep their fds and threads flat over many
generations.

Each generation builds a gloo group over a fresh store connection: a worker
that kept its old groups (as ``real/worker.py`` did) grew by about 6 fds and
3 threads a generation: 381 fds after about 60 generations of this run,
which is ``real-pause-one`` made fast (tests/resource_probe.py): the last of 3
workers paused past a 0.4 s detector timeout 30 times, each pause an
eviction and a rejoin, about 60 generations. Worker 0 is never faulted and
the paused worker keeps its process (SIGSTOP, SIGCONT): both live through
every generation. The probe samples their /proc fds and threads while the
run goes on; nothing sleeps to synchronise (the sampler's waits are joins of
the run's thread, bounded; the run is stopped, as SIGTERM stops it, once the
paused worker is back after the last pause, and bounded by its wall limit).

The bound. The most a worker holds in each later generation is at most the
most it held in its 2nd and 3rd (one generation with the paused worker and
one without) plus two groups. A retired group's teardown waits for its
collective still pending on the paused peer (see ``Reaper`` in
real/worker.py), so at a generation change a worker may hold, for a moment,
the group it is building, the one it has just retired and the one before,
whose teardown waits for the paused peer to wake; the early peak already
shows one of these (measured: 17 fds against 11 with one group). A group
costs about 6 fds (its peer sockets, the gloo device's listening socket and
epoll fd, the store connection: measured 6 for a group of 2) and 3 threads
(two gloo workers and the device loop; the build thread while it builds).
Measured beside a CPU hog:
17 fds and 8 threads early, at most 23 and 11 later; without the reaper,
24 fds early and 381 later.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from real_processes import REAL_PROCESSES
from resource_probe import pause_scenario, peaks, sample_run
from rollcall.results import read_history

pytestmark = [*REAL_PROCESSES, pytest.mark.slow]  # half a minute of one real run

PAUSES = 30
FD_SLACK = 2 * 6  # two groups (see the module docstring)
THREAD_SLACK = 2 * 3


@pytest.mark.timeout(240)
def test_fds_and_threads_stay_flat_over_many_generations(tmp_path: Path) -> None:
    scenario, wall_s = pause_scenario(PAUSES)
    victim = scenario.cluster.workers - 1
    # ended once the victim is back after the last pause (the wall limit only
    # bounds a run that never gets there)
    summary, samples = sample_run(scenario, tmp_path, wall_s, workers=(0, victim),
                                  until=lambda tail: tail.rejoined_after(PAUSES, victim))
    assert summary["valid"] is True, summary["violations"]
    assert summary["samples_duplicated"] == 0
    faults = [r for r in read_history(tmp_path) if r["f"] == "fault" and r["kind"] == "pause"]
    assert len(faults) == PAUSES, "the wall limit came before the last pause"
    assert summary["generations"] >= PAUSES, summary["generations"]  # two a pause, less a few
    lives = {}
    for p in summary["processes"]:
        lives.setdefault(p["worker"], []).append(p["incarnation"])
    assert lives[0] == [0] and lives[victim] == [0], lives  # one process each, all run long
    for w in (0, victim):
        (fds_early, threads_early), (fds_late, threads_late) = peaks(samples, w)
        assert fds_late <= fds_early + FD_SLACK, (w, fds_early, fds_late)
        assert threads_late <= threads_early + THREAD_SLACK, (w, threads_early, threads_late)
    assert not [p["pid"] for p in summary["processes"] if psutil.pid_exists(p["pid"])
                and psutil.Process(p["pid"]).status() != psutil.STATUS_ZOMBIE]
