"""Why a run cannot start as asked: each check says so in one line, or None.

Every command that starts runs (``run``, ``compare``, ``sweep``, and
:func:`rollcall.run`) asks :func:`run_problem` before anything is written:
hosts that need network namespaces, an etcd-backed keeper without etcd, a
device this machine lacks, more worker processes than it holds, a history
larger than ``--max-history-mb``.
"""

from __future__ import annotations

import os

from rollcall.app import targets
from rollcall.results import history_estimate_bytes
from rollcall.scenario import Scenario

__all__ = ["MAX_HISTORY_MB", "REAL_WORKERS_PER_CPU", "REAL_WORKER_BYTES", "device_problem",
           "hosts_problem", "keeper_problem", "per_sample_ledger", "real_capacity",
           "run_problem", "size_problem"]

#: default of --max-history-mb: a failure-free history larger than this is refused
MAX_HISTORY_MB = 1024
#: resident memory of one real worker process (torch imported, a small model), about
REAL_WORKER_BYTES = 512 << 20
#: real worker processes per CPU core, at most (gloo workers on CPUs share cores)
REAL_WORKERS_PER_CPU = 4


def run_problem(scenario: Scenario, external_hosts: bool, ledger: bool,
                max_history_mb: int | None, force: bool) -> str | None:
    """The first reason the run cannot start here as asked, or None.

    ``external_hosts``: the host agents are someone else's (``rollcall
    keeper``); ``ledger``: ``--ledger``; ``max_history_mb``: None for the
    default; ``force``: ``--force``."""
    limit_mb = MAX_HISTORY_MB if max_history_mb is None else max_history_mb
    return (hosts_problem(scenario, external_hosts) or keeper_problem(scenario)
            or device_problem(scenario)
            or size_problem(scenario, per_sample_ledger(scenario, ledger), limit_mb, force))


def real_capacity() -> int:
    """Real worker processes this machine can hold: by CPU count and by physical memory."""
    cpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = REAL_WORKER_BYTES * REAL_WORKERS_PER_CPU * cpus
    return max(1, min(REAL_WORKERS_PER_CPU * cpus, memory // REAL_WORKER_BYTES))


def hosts_problem(scenario: Scenario, external_hosts: bool) -> str | None:
    """Why a real scenario with hosts cannot run here (one line), or None: its
    hosts are network namespaces, which need root or CAP_NET_ADMIN (and nft),
    unless the hosts are external (``rollcall keeper``)."""
    if scenario.target != "real" or scenario.cluster.workers_per_host is None or external_hosts:
        return None
    reason = targets.netns_problem()
    if reason is None:
        return None
    return (f"{scenario.name}: cluster.workers_per_host runs hosts as network namespaces on the "
            f"real target: {reason}")


def device_problem(scenario: Scenario) -> str | None:
    """Why a real scenario's ``cluster.device``/``backend`` cannot run on this
    machine (one line), or None: CUDA absent, or fewer GPUs than ``nccl``'s
    one per worker. Checked here, at run time, not when the file is parsed:
    a scenario is often validated on a machine without GPUs."""
    if scenario.target != "real" or scenario.cluster.device == "cpu":
        return None  # no torch import for the common case
    return targets.device_problem(scenario)


def keeper_problem(scenario: Scenario) -> str | None:
    """Why a real scenario's etcd-backed keeper cannot run here (one line), or None."""
    if scenario.target != "real" or scenario.keeper.store == "memory":
        return None
    k = scenario.keeper
    if k.etcd_endpoints is not None:  # the user's cluster: reachable, and these credentials do
        problem = targets.etcd_cluster_problem(k.etcd_endpoints, k.etcd_user,
                                               k.etcd_password_file)
        return None if problem is None else f"{scenario.name}: {problem}"
    if targets.etcd_binary() is None:
        return (f"{scenario.name}: keeper.store: etcd needs the etcd server (Debian's "
                f"etcd-server: apt-get install etcd-server)")
    return None


def size_problem(scenario: Scenario, per_sample: bool, max_history_mb: int,
                 force: bool) -> str | None:
    """Why the run is too large to start (one line), or None.

    The real target starts a process per worker id up front (spares and
    newcomers idle), so more ids than :func:`real_capacity` would swap or
    fork-bomb the machine; a history larger than ``--max-history-mb`` (the
    floor of a failure-free run) would fill the disk without a word.
    """
    if scenario.target == "real" and not force:
        procs, limit = scenario.worker_id_limit, real_capacity()
        if procs > limit:
            return (f"{scenario.name}: the real target would start {procs} worker processes "
                    f"(workers + spares + joins); this machine holds about {limit} "
                    f"({REAL_WORKERS_PER_CPU} per CPU, {REAL_WORKER_BYTES >> 20} MiB each); "
                    f"pass --force to run anyway")
    estimate = history_estimate_bytes(scenario, per_sample)
    if estimate > max_history_mb << 20:
        return (f"{scenario.name}: workload.steps={scenario.workload.steps} would write a history "
                f"of at least {estimate >> 20} MiB, more than --max-history-mb {max_history_mb}; "
                f"raise --max-history-mb, or run fewer steps or a longer "
                f"strategy.checkpoint_interval_steps")
    return None


def per_sample_ledger(scenario: Scenario, ledger: bool) -> bool:
    """Whether the run writes one ledger record per member per step (see ``sim.driver``)."""
    if scenario.target != "sim" or ledger:
        return True
    # a stand-in sim driver without the constant: the compact ledger, the floor
    small = targets.ledger_samples(scenario.target)
    return scenario.workload.steps * scenario.workload.global_batch <= small
