"""A scripted join of several workers arrives as one batch on the real target.

On the sim the newcomers of ``join: n`` start at once and one roll call
admits them all. On the real target each is a process (prewarmed or
started when the join fires) that becomes ready when it has imported torch;
a process that is scheduled late must not split the arrival into two roll
calls. :meth:`real.lives.Lives.join` opens one join batch for the
newcomers: none activates before every one is ready, and their Joins reach
the keeper as one arrival. The prewarmed processes of scripted joins are
started with the first batch, which waits for them to be ready too, so a
join fires on schedule rather than a cold start later. The launcher's
collaborators are small fakes
here; :class:`real.processes.Processes` runs in hosts mode, where starting a
life is an order to a host agent (a recorded call) rather than a process.
"""

from __future__ import annotations

import selectors
from pathlib import Path
from typing import Any, Optional

from real.lives import Lives
from real.processes import Processes
from rollcall.core import Draws, Join, RepairShop
from rollcall.scenario import parse_scenario

SCENARIO = """
name: join-batch
target: real
cluster: {workers: 2, workers_per_host: 1}
workload: {steps: 20, global_batch: 8, micro_batch: 4, dataset_samples: 160}
strategy: {kind: elastic}
failures:
  schedule:
    - {at_step: 5, join: 3}
"""


class Recorder:
    """Records every call made on it (a fleet's orders, the keeper's port)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, args))


class Host:
    """The launcher, as far as joins go."""

    def __init__(self, tmp: Path) -> None:
        self.sc = parse_scenario(SCENARIO)
        self.out = tmp
        self.t = 0.0
        self.keeper = Recorder()
        self.lives: Optional[Lives] = None
        self.processes = Processes(tmp, 0.0, tmp / "secret", selectors.DefaultSelector(),
                                   self.now, None)  # type: ignore[arg-type]
        self.processes.fleet = Recorder()  # type: ignore[assignment]

    def now(self) -> float:
        return self.t


def lives_of(tmp: Path) -> tuple[Host, Lives]:
    host = Host(tmp)
    shop = RepairShop(Draws(0, None), None, up=2, want=2, target=2)
    lives = Lives(host, shop)  # type: ignore[arg-type]
    host.processes.joins = lives.joins
    return host, lives


def test_the_newcomers_of_one_join_activate_together(tmp_path: Path) -> None:
    host, lives = lives_of(tmp_path)
    idle = [lives.spawn_new(spare=True) for _ in range(2)]  # prewarmed
    joined = lives.join(3)  # two prewarmed, one started now
    assert joined == [2, 3, 4]
    procs = [host.processes.of_life(w, 0) for w in joined]
    assert procs[:2] == idle and all(p is not None and p.want for p in procs)
    assert len({p.batch for p in procs}) == 1 and procs[0].batch is not None
    batches = [args for name, args in host.keeper.calls if name == "batch"]
    assert [sorted(lives) for lives, _ in batches] == [[(2, 0), (3, 0), (4, 0)]]
    for p in procs[:2]:
        p.ready = True
    host.t = 1.0
    assert host.processes.ready_to_activate() == []  # the third is still starting
    procs[2].ready = True
    assert host.processes.ready_to_activate() == procs


def test_their_joins_reach_the_keeper_as_one_arrival(tmp_path: Path) -> None:
    host, lives = lives_of(tmp_path)
    joined = lives.join(2)
    held = [lives.joins.hold(1.0 + i, (w, 0), Join(w, 0, None))
            for i, w in enumerate(joined)]
    assert held == [True, True]
    assert [[j.worker for j in batch] for batch in lives.joins.release(2.0)] == [joined]


def test_the_first_batch_waits_for_the_prewarmed_newcomers(tmp_path: Path) -> None:
    host, lives = lives_of(tmp_path)
    batch = lives.start_batch([(0, 0), (1, 0)])
    spare = lives.spawn_new(spare=True, batch=batch)
    workers = [host.processes.of_life(w, 0) for w in (0, 1)]
    for p in workers:
        p.ready = True
    assert host.processes.ready_to_activate() == []  # the prewarmed one is importing torch
    spare.ready = True
    assert host.processes.ready_to_activate() == workers  # it stays idle until its join
    assert lives.join(1) == [spare.worker] and spare.batch != batch
