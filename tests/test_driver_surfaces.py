"""The narrow surfaces inside the drivers are real, not comments.

* The sim's fault carriers (keeper failover, links, gray failures) reach the
  simulation only through :class:`sim.world.World`; its agents
  (:class:`sim.agents.Agents`), machines (:class:`sim.machines.Machines`),
  silences (:class:`sim.silence.Silences`), votes (:class:`sim.votes.Votes`),
  job (:class:`sim.job.Job`) and keeper's side
  (:class:`sim.keeper_port.KeeperPort`) only through their own host
  protocols, and the job's state through :class:`sim.host.JobState`; the
  keeper's side reaches the job through :class:`sim.keeper_port.Job`.
* The launcher's side of a keeper in its own processes
  (:class:`real.keeper_link.RemoteKeeper`, and its etcd and keeper processes,
  :class:`real.keeper_side.KeeperSide`) reaches the launcher only through
  :class:`real.keeper_port.Supervisor`, the real nemesis
  (:class:`real.nemesis.Nemesis`) only through :class:`real.nemesis.Cluster`,
  the keeper service's links (:class:`real.service.Service`) only through
  :class:`real.service.Handler` and, for the host agents' links,
  :class:`real.service.HostHandler`, and those host links
  (:class:`real.host_links.HostLinks`), the worker processes' lives
  (:class:`real.lives.Lives`), the machines (:class:`real.nodes.Nodes`)
  and the keeper's outputs (:class:`real.outputs.Outputs`) only through
  protocols of their own, as a worker's training thread
  (:class:`real.trainer.Trainer`) reaches its control side
  (:class:`real.worker.Worker`); a keeper, in the launcher's process or in its
  own, reaches those outputs only as a :class:`real.keeper_port.Sink`
  (:class:`real.keeper_port.RemoteSink`).

Each user is scanned for the members it touches through its handle; the
class behind the protocol is scanned for the members it defines.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

from real.keeper_port import RemoteSink, Sink, Supervisor
from real.nemesis import Cluster
from real.host_links import HostLinksHost
from real.lives import LivesHost
from real.nodes import Owner
from real.outputs import OutputsHost
from real.trainer import TrainerHost
from real.service import Handler, HostHandler
from sim.agents import AgentHost
from sim.host import JobState
from sim.job import JobHost
from sim.keeper_port import Job, PortHost
from sim.machines import MachineHost
from sim.silence import SilenceHost
from sim.votes import VoteHost
from sim.world import World

ROOT = Path(__file__).resolve().parent.parent


class Surface(NamedTuple):
    protocol: type
    users: list[str]  # files that hold the handle
    handle: str  # the handle's name, as a variable or as ``self.<handle>``
    assignable: set[str]  # members a user may set
    owner: tuple[str, str]  # (file, class) that offers the protocol


SURFACES = {
    "sim-world": Surface(World, ["sim/failover.py", "sim/gray.py", "sim/nemesis.py",
                                 "sim/network.py"], "sim",
                         {"keeper"}, ("sim/driver.py", "Simulation")),
    "sim-agents": Surface(AgentHost, ["sim/agents.py"], "host", set(),
                          ("sim/driver.py", "Simulation")),
    "sim-machines": Surface(MachineHost, ["sim/machines.py"], "host", set(),
                            ("sim/driver.py", "Simulation")),
    "sim-silences": Surface(SilenceHost, ["sim/silence.py"], "host", set(),
                            ("sim/driver.py", "Simulation")),
    "sim-votes": Surface(VoteHost, ["sim/votes.py"], "host", set(),
                         ("sim/driver.py", "Simulation")),
    "sim-keeper-port": Surface(PortHost, ["sim/keeper_port.py"], "host", set(),
                               ("sim/driver.py", "Simulation")),
    "sim-job": Surface(Job, ["sim/keeper_port.py"], "job", set(), ("sim/job.py", "Job")),
    "sim-job-host": Surface(JobHost, ["sim/job.py"], "host", set(), ("sim/driver.py", "Simulation")),
    # the job's state, as every part reads it through its host (sim.host.JobState)
    "sim-job-state": Surface(JobState, ["sim/agents.py", "sim/machines.py", "sim/silence.py",
                                        "sim/votes.py", "sim/keeper_port.py"], "host.job", set(),
                             ("sim/job.py", "Job")),
    "sim-world-job-state": Surface(JobState, ["sim/failover.py", "sim/gray.py", "sim/nemesis.py",
                                              "sim/network.py"], "sim.job", set(),
                                   ("sim/job.py", "Job")),
    "real-supervisor": Surface(Supervisor, ["real/keeper_link.py", "real/keeper_side.py"],
                               "supervisor", set(),
                               ("real/launcher.py", "Launcher")),
    "real-cluster": Surface(Cluster, ["real/nemesis.py"], "cluster", set(),
                            ("real/launcher.py", "Launcher")),
    "real-service": Surface(Handler, ["real/service.py"], "handler", set(),
                            ("real/launcher.py", "Launcher")),
    "real-service-hosts": Surface(HostHandler, ["real/service.py"], "host_handler", set(),
                                  ("real/host_links.py", "HostLinks")),
    "real-host-links": Surface(HostLinksHost, ["real/host_links.py"], "host", set(),
                               ("real/launcher.py", "Launcher")),
    "real-lives": Surface(LivesHost, ["real/lives.py"], "host", set(),
                          ("real/launcher.py", "Launcher")),
    "real-nodes": Surface(Owner, ["real/nodes.py"], "owner", set(), ("real/lives.py", "Lives")),
    "real-trainer": Surface(TrainerHost, ["real/trainer.py"], "host", set(),
                            ("real/worker.py", "Worker")),
    "real-outputs": Surface(OutputsHost, ["real/outputs.py"], "host", set(),
                            ("real/launcher.py", "Launcher")),
    "real-sink": Surface(Sink, ["real/keeper_port.py"], "sink", set(),
                         ("real/outputs.py", "Outputs")),
    "real-remote-sink": Surface(RemoteSink, ["real/keeper_link.py"], "sink", set(),
                                ("real/outputs.py", "Outputs")),
}


def members(protocol: type) -> set[str]:
    """The names a protocol declares (its own and its bases'): attributes,
    properties and methods."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False):
            continue
        names |= set(getattr(cls, "__annotations__", {}))
        names |= {n for n in vars(cls) if not n.startswith("_")}
    return names


def _is_handle(node: ast.expr, handle: str) -> bool:
    """``handle`` as a variable, or as ``self.<handle>`` or ``self._<handle>``;
    a dotted ``outer.inner`` is member ``inner`` of handle ``outer``."""
    outer, dot, inner = handle.rpartition(".")
    if dot:
        return (isinstance(node, ast.Attribute) and node.attr == inner
                and _is_handle(node.value, outer))
    if isinstance(node, ast.Name):
        return node.id == handle
    return (isinstance(node, ast.Attribute) and node.attr in (handle, f"_{handle}")
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def touches(source: str, handle: str) -> list[tuple[str, bool, int]]:
    """Each use of the handle in ``source``: (member, whether it is set, line)."""
    out = [(node.attr, isinstance(node.ctx, ast.Store), node.lineno)
           for node in ast.walk(ast.parse(source))
           if isinstance(node, ast.Attribute) and _is_handle(node.value, handle)]
    return sorted(out, key=lambda use: use[2])


def offences(source: str, surface: Surface) -> list[str]:
    allowed = members(surface.protocol)
    return [f"line {line}: {'sets' if stored else 'uses'} {surface.handle}.{name}"
            for name, stored, line in touches(source, surface.handle)
            if name not in allowed or (stored and name not in surface.assignable)]


def defined(path: Path, class_name: str) -> set[str]:
    """What a class offers: its methods and properties, and every ``self.X`` it sets."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                   else [])
        names |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                  and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return names


@pytest.mark.parametrize("name", SURFACES)
def test_the_users_touch_only_the_protocol(name: str) -> None:
    surface = SURFACES[name]
    found = {path: offences((ROOT / path).read_text(encoding="utf-8"), surface)
             for path in surface.users}
    assert not any(found.values()), found


@pytest.mark.parametrize("name", SURFACES)
def test_the_owner_offers_every_member(name: str) -> None:
    surface = SURFACES[name]
    path, class_name = surface.owner
    missing = sorted(members(surface.protocol) - defined(ROOT / path, class_name))
    assert not missing, f"{class_name} lacks {missing}"


def test_the_scans_find_what_they_look_for() -> None:
    surface = SURFACES["sim-world"]
    source = ("class A:\n"
              "    def f(self, sim):\n"
              "        sim._close_segment(0.0)\n"
              "        self.sim.step_s = 1.0\n"
              "        sim.keeper = None\n"
              "        sim.at(1.0, print)\n"
              "        self.ready = True\n")
    assert offences(source, surface) == ["line 3: uses sim._close_segment",
                                         "line 4: sets sim.step_s"]
    assert {"at", "write", "keeper", "env"} <= members(World)
    assert {"job", "alive", "env"} <= members(VoteHost)  # a base's (Host's) members count
    job = SURFACES["sim-job-state"]
    source = ("class B:\n"
              "    def f(self, host):\n"
              "        host.job.passed(0.0, None, False)\n"
              "        self._host.job.state = 'done'\n"
              "        host.keeper.job.x = 1\n")
    assert offences(source, job) == ["line 4: sets host.job.state"]


def test_the_owner_scan_reads_methods_and_attributes(tmp_path: Path) -> None:
    path = tmp_path / "owner.py"
    path.write_text("class A:\n"
                    "    x: int = 0\n"
                    "    def __init__(self):\n"
                    "        self.a = 1\n"
                    "        self.b: int = 2\n"
                    "    def m(self):\n"
                    "        self.c += 1\n"
                    "    @property\n"
                    "    def p(self):\n"
                    "        return 1\n", encoding="utf-8")
    assert defined(path, "A") == {"__init__", "a", "b", "c", "m", "p"}
