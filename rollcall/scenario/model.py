"""The whole scenario: its sections, the checks that span them, and the
values derived from them (ids, hosts and racks, step times)."""

from __future__ import annotations

import math
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rollcall.scenario.base import (
    MAX_EXTRA_JOINS, MAX_WORKER_IDS, Name, NonNegInt, Problem, Section, Text, count_of, show,
)
from rollcall.scenario.faults import LINK_ACTIONS, KillEtcdFault
from rollcall.scenario.scale import resolve_scale
from rollcall.scenario.sections import (
    Cluster, Detector, Failures, KeeperSection, Network, Rendezvous, State, Strategy, Workload,
)
from rollcall.scenario.yaml_text import ScenarioDumper

# the failure domains, each with the cluster key of its size (workers per domain)
_DOMAINS = {"rack": "rack_size", "host": "workers_per_host"}


class Scenario(Section):
    """A whole experiment. Build it with :func:`load_scenario`/:func:`parse_scenario`."""

    name: Name
    description: Text = ""
    seed: NonNegInt = 0
    target: Literal["sim", "real"] = "sim"
    cluster: Cluster = Field(default_factory=Cluster)
    workload: Workload = Field(default_factory=Workload)
    failures: Failures = Field(default_factory=Failures)
    detector: Detector = Field(default_factory=Detector)
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    network: Network = Field(default_factory=Network)
    strategy: Strategy = Field(default_factory=Strategy)
    state: State = Field(default_factory=State)
    keeper: KeeperSection = Field(default_factory=KeeperSection)

    @model_validator(mode="before")
    @classmethod
    def _rendezvous_defaults(cls, data: Any) -> Any:
        # The size bounds default from the cluster, which a field default
        # cannot see; fill them into the raw mapping before validation.
        # The scale helpers (cluster.gpus, fractions, per-worker batch, rates
        # per 1,000 node-days) become canonical keys first: they need the
        # worker count too, and the defaults must see the resolved one.
        if not isinstance(data, dict):
            return data
        data = resolve_scale(data)
        cluster = data.get("cluster")
        workers = cluster.workers if isinstance(cluster, Cluster) else (
            cluster.get("workers", Cluster().workers) if isinstance(cluster, dict)
            else Cluster().workers if cluster is None else None
        )
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            return data  # cluster.workers itself will be reported
        rdv = data.get("rendezvous", {})
        if rdv is None:
            rdv = {}
        if not isinstance(rdv, dict):
            return data
        rdv = dict(rdv)
        rdv.setdefault("max_workers", workers)
        top = rdv["max_workers"]
        if isinstance(top, int) and not isinstance(top, bool) and top >= 1:
            rdv.setdefault("min_workers", min(2, top))
        return {**data, "rendezvous": rdv}

    @field_validator("name")
    @classmethod
    def _name_stays_in_runs(cls, value: str) -> str:
        # the name is a directory under runs/: "." and ".." would leave it
        if value in (".", ".."):
            raise PydanticCustomError(
                "rollcall_name", "must not be '.' or '..' (the run directory runs/<name>/ "
                "would leave runs/), got {got}", {"got": show(value)})
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        c, r = self.cluster, self.rendezvous
        self._check_sizes()
        self._check_hosts()
        if self.target == "real" and self.failures.age == "computing":
            raise Problem(("failures", "age"), "computing is sim only (a real node ages whether "
                                                "the job computes or not); use always")
        if r.max_workers < c.workers:
            raise Problem(
                ("rendezvous", "max_workers"),
                f"must be >= cluster.workers={c.workers}, got {r.max_workers}",
            )
        if r.min_workers > c.workers + c.spares:
            raise Problem(
                ("rendezvous", "min_workers"),
                f"must be <= cluster.workers + cluster.spares = {c.workers + c.spares}"
                f" (else the job can never start), got {r.min_workers}",
            )
        limit = self.worker_id_limit
        joined = self.pool_first_id - c.workers - c.spares
        self._check_keeper_faults()
        for i, fault in enumerate(self.failures.schedule):
            if fault.domain is not None:
                self._check_domain(i, *fault.domain, fault.action)
            for host in fault.hosts:  # partition, isolate_keeper
                self._check_domain(i, "host", host, fault.action)
            if fault.link is not None:
                self._check_domain(i, "host", fault.link, fault.action)
            targets = fault.targets
            if targets == "random":
                continue
            unknown = [w for w in targets if w >= limit]
            if unknown:
                raise Problem(
                    ("failures", "schedule", i, fault.action),
                    f"worker {unknown[0]} does not exist (ids are 0..{limit - 1}:"
                    f" {count_of(c.workers, 'worker')} + {count_of(c.spares, 'spare')}"
                    f" + {joined} joined + {c.spare_pool} in the pool)",
                )
        return self

    def _check_keeper_faults(self) -> None:
        """A keeper or etcd fault needs the keeper it hits: an etcd store,
        and for ``kill_keeper`` a standby to take over."""
        k = self.keeper
        if (k.worker_links == "direct" and k.etcd_endpoints is not None
                and self.cluster.workers_per_host is not None):
            raise Problem(("keeper", "worker_links"),
                           "direct with keeper.etcd_endpoints cannot have hosts "
                           "(cluster.workers_per_host): a host's namespace does not reach "
                           "your cluster on this machine's loopback")
        for i, fault in enumerate(self.failures.schedule):
            action = fault.action
            if k.worker_links == "direct" and action in LINK_ACTIONS:
                raise Problem(("failures", "schedule", i, action),
                               "not built with keeper.worker_links: direct yet (the "
                               "workers' links go to the keeper's host, not the launcher's)")
            if action not in ("kill_keeper", "kill_etcd", "partition_keeper"):
                continue
            if k.store != "etcd":
                raise Problem(("failures", "schedule", i, action),
                               "needs keeper.store: etcd (the keeper's record in etcd)")
            if action in ("kill_keeper", "partition_keeper") and k.standbys < 1:
                raise Problem(("failures", "schedule", i, action),
                               "needs keeper.standbys >= 1 (a standby to take over)")
            if action == "kill_etcd" and k.etcd_endpoints is not None:
                raise Problem(("failures", "schedule", i, action),
                               "only on the etcd cluster the run starts itself "
                               "(keeper.etcd_endpoints is the user's)")
            if isinstance(fault, KillEtcdFault) and fault.kill_etcd > 2:
                raise Problem(("failures", "schedule", i, action),
                              f"the run's etcd cluster has members 0..2, got {fault.kill_etcd}")

    def _check_sizes(self) -> None:
        """Refuse sizes no target can run: the keeper tracks every worker id."""
        c, r = self.cluster, self.rendezvous
        joins = [(i, f.newcomers) for i, f in enumerate(self.failures.schedule) if f.newcomers]
        joined = sum(n for _, n in joins)
        if joins and joined > r.max_workers + MAX_EXTRA_JOINS:
            i = joins[-1][0]
            raise Problem(
                ("failures", "schedule", i, "join"),
                f"the schedule joins {joined} newcomers in all, more than rendezvous.max_workers"
                f"={r.max_workers} + {MAX_EXTRA_JOINS} (no job holds that many; the rest would"
                f" only idle)",
            )
        total = c.workers + c.spares + joined + c.spare_pool
        if total > MAX_WORKER_IDS:
            raise Problem(
                ("cluster", "workers"),
                f"workers + spares + joins + spare_pool = {total} worker ids, more than"
                f" {MAX_WORKER_IDS}",
            )

    def warnings(self) -> list[tuple[str, str]]:
        """(dotted field, message) for what is valid but will not do what it says.

        A warning, not an error: in a sweep over ``workload.steps`` one
        point's fault may well lie beyond its end.
        """
        out: list[tuple[str, str]] = []
        steps = self.workload.steps
        for i, fault in enumerate(self.failures.schedule):
            if fault.at_step is not None and fault.at_step >= steps:
                out.append((
                    f"failures.schedule.{i}.at_step",
                    f"the job ends at step workload.steps={steps}, so this fault at step "
                    f"{fault.at_step} never fires",
                ))
        return out

    def _check_hosts(self) -> None:
        """Hosts hold whole groups of ids: the initial workers fill whole
        hosts, and racks whole hosts."""
        c = self.cluster
        k = c.workers_per_host
        if k is None:
            return
        if c.workers % k:
            raise Problem(("cluster", "workers_per_host"),
                           f"cluster.workers={c.workers} does not fill hosts of {k}: the "
                           f"initial workers fill whole hosts")
        if c.rack_size is not None and c.rack_size % k:
            raise Problem(("cluster", "rack_size"),
                           f"must be a multiple of cluster.workers_per_host={k} (racks group "
                           f"whole hosts), got {c.rack_size}")

    def _check_domain(self, i: int, domain: str, index: int | str, key: str) -> None:
        """A fault naming a rack or a host: the cluster has them, and that one exists."""
        where = ("failures", "schedule", i, key)
        field = _DOMAINS[domain]
        size = getattr(self.cluster, field)
        if size is None:
            raise Problem(where, f"needs cluster.{field} (workers per {domain}), which is not set")
        n = self.n_domains(domain)
        if index != "random" and not 0 <= int(index) < n:
            raise Problem(
                where,
                f"{domain} {index} does not exist ({domain}s are 0..{n - 1}: worker ids"
                f" 0..{self.worker_id_limit - 1} in {domain}s of cluster.{field}={size})",
            )

    # -- derived values ------------------------------------------------------

    def n_domains(self, domain: str) -> int:
        """Racks or hosts (``domain``) that can ever hold a worker (0 without their size)."""
        size = getattr(self.cluster, _DOMAINS[domain])
        return 0 if size is None else -(-self.worker_id_limit // size)

    def domain_of(self, domain: str, worker: int) -> int | None:
        """The rack or host of worker id ``worker`` (None without their size)."""
        size = getattr(self.cluster, _DOMAINS[domain])
        return None if size is None else worker // size

    def domain_workers(self, domain: str, index: int) -> tuple[int, ...]:
        """Every worker id that can ever live in rack or host ``index`` (alive or not)."""
        size = getattr(self.cluster, _DOMAINS[domain])
        if size is None:
            return ()
        return tuple(range(index * size, min((index + 1) * size, self.worker_id_limit)))

    @property
    def n_hosts(self) -> int:
        return self.n_domains("host")

    def host_of(self, worker: int) -> int | None:
        return self.domain_of("host", worker)

    def host_workers(self, host: int) -> tuple[int, ...]:
        return self.domain_workers("host", host)

    @property
    def n_racks(self) -> int:
        return self.n_domains("rack")

    def rack_of(self, worker: int) -> int | None:
        return self.domain_of("rack", worker)

    def rack_workers(self, rack: int) -> tuple[int, ...]:
        return self.domain_workers("rack", rack)

    @property
    def state_shards(self) -> int:
        """Number of state shards under ``sharding: sharded`` (default ``cluster.workers``)."""
        return self.state.shards if self.state.shards is not None else self.cluster.workers

    @property
    def shards_per_step(self) -> int:
        """Virtual shards (micro-batches) in one global batch."""
        return self.workload.global_batch // self.workload.micro_batch

    @property
    def ideal_step_s(self) -> float:
        """Step time with all initial workers healthy: shards spread evenly, then one allreduce."""
        measured = self.workload.step_s_by_workers.get(self.cluster.workers)
        if measured is not None:
            return measured
        per_worker = math.ceil(self.shards_per_step / self.cluster.workers)
        return per_worker * self.workload.micro_batch_s + self.workload.allreduce_s

    def exchange_s(self, workers: int) -> float:
        """Sim time of one step's gradient exchange among ``workers``.

        ``fast``: ``workload.allreduce_s`` (float32 gradients). ``exact``
        (see ``real/reduce.py``) sums int32 fixed-point values, the same
        bytes, under a scale guessed from the shared momentum, so with
        replicated state it costs the same exchange (the scalar MAX that
        fixes the scale on the first step, or after a gradient spike, is
        left out: rare). With ``state.sharding: sharded`` the momentum is
        sliced and every step first takes a scalar MAX of the owners'
        maxima: latency-bound, a tree of ``2 * ceil(log2(workers))`` hops
        of ``network.latency_s``. The per-micro-batch encoding is compute,
        not priced here (``benchmarks/exact_overhead.py`` measures it).
        """
        if self.strategy.reduction == "fast" or self.state.sharding != "sharded":
            return self.workload.allreduce_s
        hops = 2 * math.ceil(math.log2(workers)) if workers > 1 else 0
        return self.workload.allreduce_s + hops * self.network.latency_s

    @property
    def worker_id_limit(self) -> int:
        """One past the largest worker id that can ever exist (workers + spares
        + joins + the cold pool, whose ids come last)."""
        return self.pool_first_id + self.cluster.spare_pool

    @property
    def pool_first_id(self) -> int:
        """The id of the first spare pulled from the cold pool (after every join)."""
        joins = sum(f.newcomers for f in self.failures.schedule)
        return self.cluster.workers + self.cluster.spares + joins

    # -- output --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved scenario as plain JSON-able data (lists, not tuples)."""
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The fully resolved scenario as YAML; ``parse_scenario`` gives back an equal object."""
        # allow_unicode=False: characters such as U+0085 would otherwise be written
        # raw and read back as line breaks; escaped, every string round-trips.
        # ScenarioDumper quotes strings that ScenarioLoader would read as numbers ("0E0").
        return yaml.dump(self.to_dict(), Dumper=ScenarioDumper, sort_keys=False, allow_unicode=False)


