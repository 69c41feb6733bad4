"""The scenario schema: defaults, round trip, overrides, flags, shipped files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rollcall.app import cli
from rollcall.config import scheduled_faults
from rollcall.scenario import (
    FAULT_KEYS,
    FAULT_MODELS,
    KillFault,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))

MINIMAL = "name: tiny\n"

SCHEDULED = """\
name: scheduled
cluster: {workers: 4, spares: 1}
failures:
  worker_mtbf_s: 7200
  schedule:
    - {at_s: 2, kill: 1}
    - {at_step: 30, kill: [0, 2]}
    - {at_s: 4.5, pause: random, for_s: 6}
    - {at_s: 10, join: 2}
    - {at_step: 40, kill: 6}
"""


def test_defaults_are_filled() -> None:
    s = parse_scenario(MINIMAL)
    assert s.name == "tiny" and s.description == "" and s.seed == 0 and s.target == "sim"
    assert (s.cluster.workers, s.cluster.gpus_per_worker, s.cluster.spares, s.cluster.repair_s) == (4, 1, 0, None)
    w = s.workload
    assert (w.steps, w.global_batch, w.micro_batch, w.dataset_samples) == (200, 64, 8, 4096)
    assert (w.micro_batch_s, w.allreduce_s, w.model_params, w.bytes_per_param, w.lr) == (
        0.02, 0.005, 1_000_000, 12.0, 0.05,
    )
    assert s.failures.worker_mtbf_s is None and s.failures.distribution == "exponential"
    assert s.failures.weibull_shape == 0.7 and s.failures.schedule == ()
    assert (s.detector.kind, s.detector.heartbeat_s, s.detector.timeout_s) == ("timeout", 0.5, 3.0)
    r = s.rendezvous
    assert (r.min_workers, r.max_workers, r.last_call_s, r.join_timeout_s) == (2, 4, 0.5, 600.0)
    assert (s.network.latency_s, s.network.bandwidth_Bps) == (0.0005, 1.25e9)
    k = s.strategy
    assert (k.kind, k.checkpoint_interval_steps, k.checkpoint_write_s, k.checkpoint_read_s, k.restart_s) == (
        "elastic", 50, 1.0, 2.0, 30.0,
    )
    assert (k.batch, k.lr_scaling, k.reduction) == ("constant", "none", "fast")


def test_rendezvous_bounds_default_from_cluster() -> None:
    s = parse_scenario("name: big\ncluster: {workers: 16, spares: 2}\n")
    assert s.rendezvous.max_workers == 16 and s.rendezvous.min_workers == 2
    one = parse_scenario("name: one\ncluster: {workers: 1}\n")
    assert one.rendezvous.max_workers == 1 and one.rendezvous.min_workers == 1


def test_to_dict_has_every_key_resolved() -> None:
    d = parse_scenario(MINIMAL).to_dict()
    assert set(d) == {
        "name", "description", "seed", "target", "cluster", "workload", "failures",
        "detector", "rendezvous", "network", "strategy", "state", "keeper",
    }
    assert d["keeper"]["store"] == "memory"
    assert d["rendezvous"]["max_workers"] == 4
    assert d["failures"]["schedule"] == []


@pytest.mark.parametrize("text", [MINIMAL, SCHEDULED], ids=["minimal", "scheduled"])
def test_to_yaml_round_trips(text: str) -> None:
    s = parse_scenario(text)
    again = parse_scenario(s.to_yaml())
    assert again == s
    assert again.to_yaml() == s.to_yaml()
    assert yaml.safe_load(s.to_yaml()) == s.to_dict()


def test_fault_properties() -> None:
    s = parse_scenario(SCHEDULED)
    f = s.failures.schedule
    assert (f[0].trigger, f[0].when, f[0].action, f[0].targets, f[0].count) == ("at_s", 2.0, "kill", (1,), 1)
    assert (f[1].trigger, f[1].when, f[1].targets, f[1].count) == ("at_step", 30, (0, 2), 2)
    assert (f[2].action, f[2].targets, f[2].for_s) == ("pause", "random", 6.0)
    assert (f[3].action, f[3].targets, f[3].count) == ("join", (), 2)
    # ids: 0..3 workers, 4 the spare, 5 and 6 the two newcomers
    assert f[4].targets == (6,)
    assert s.worker_id_limit == 7
    assert s.to_dict()["failures"]["schedule"][2] == {"at_s": 4.5, "pause": "random", "for_s": 6.0}


def test_models_are_frozen() -> None:
    s = parse_scenario(MINIMAL)
    with pytest.raises(Exception):
        s.cluster.workers = 9  # type: ignore[misc]


def test_derived_step_values() -> None:
    s = parse_scenario("name: d\ncluster: {workers: 3}\nworkload: {global_batch: 64, micro_batch: 8}\n")
    assert s.shards_per_step == 8
    assert s.ideal_step_s == pytest.approx(3 * 0.02 + 0.005)  # ceil(8 / 3) shards each


def test_yaml12_exponent_floats_are_numbers() -> None:
    s = parse_scenario("name: e\nnetwork: {bandwidth_Bps: 1e10}\nfailures: {worker_mtbf_s: 3.6e3}\n")
    assert s.network.bandwidth_Bps == 1e10 and s.failures.worker_mtbf_s == 3600.0


def test_set_overrides() -> None:
    s = parse_scenario(
        SCHEDULED,
        overrides=[
            "failures.worker_mtbf_s=3600",
            "failures.schedule=[]",
            "cluster.workers=8",
            "network.latency_s=1e-3",
            "description=from the command line",
        ],
    )
    assert s.failures.worker_mtbf_s == 3600.0
    assert s.failures.schedule == ()
    assert s.cluster.workers == 8 and s.rendezvous.max_workers == 8
    assert s.network.latency_s == 0.001
    assert s.description == "from the command line"


def test_set_creates_missing_sections_and_indexes_lists() -> None:
    s = parse_scenario(SCHEDULED, overrides=["strategy.restart_s=5", "failures.schedule.0.at_s=3.5"])
    assert s.strategy.restart_s == 5.0
    assert s.failures.schedule[0].at_s == 3.5


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("nothing", "expected dotted.key=value"),
        ("=3", "expected dotted.key=value"),
        ("a..b=3", "expected dotted.key=value"),
        ("failures.schedule.9.at_s=1", "no such list index"),
        ("name.x=1", "not a mapping"),
        ("seed.x=1", "seed (from --set): expected an integer"),
        ("cluster.workers=[1", "not valid YAML"),
        ("cluster.nodes=3", "unknown key"),
    ],
)
def test_bad_set_is_one_line_error(override: str, fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(SCHEDULED, "s.yaml", overrides=[override])
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("s.yaml: ")
    assert fragment in str(info.value)


def test_flags_override_seed_target_strategy() -> None:
    s = parse_scenario(SCHEDULED, seed=7, target="real", strategy="checkpoint-restart")
    assert (s.seed, s.target, s.strategy.kind) == (7, "real", "checkpoint-restart")
    # flags win over --set
    s = parse_scenario(MINIMAL, overrides=["seed=3", "strategy.kind=elastic"], seed=4, strategy="checkpoint-restart")
    assert (s.seed, s.strategy.kind) == (4, "checkpoint-restart")


def test_flag_values_are_validated() -> None:
    with pytest.raises(ScenarioError, match=r"target \(from --target\): expected 'sim' or 'real'"):
        parse_scenario(MINIMAL, target="gpu")


def test_load_scenario_reads_files(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(SCHEDULED)
    assert load_scenario(path, ["seed=2"]) == parse_scenario(SCHEDULED, seed=2)
    assert load_scenario(str(path)) == parse_scenario(SCHEDULED)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_scenarios_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = load_scenario(path)
    assert parse_scenario(s.to_yaml()) == s
    assert cli.main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"ok: {s.name} ({s.target}, {s.strategy.kind})\n"


def test_required_shipped_scenarios() -> None:
    names = {p.name for p in SHIPPED}
    assert {"quickstart.yaml", "kill-pause-join.yaml"} <= names
    q = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    assert (q.cluster.workers, q.cluster.spares, q.workload.steps) == (8, 1, 300)
    assert (q.strategy.kind, q.strategy.batch, q.detector.timeout_s) == ("elastic", "constant", 3.0)
    assert [(f.action, f.trigger, f.when) for f in q.failures.schedule] == [
        ("kill", "at_s", 2.0), ("pause", "at_s", 4.0), ("join", "at_s", 10.0),
    ]
    k = load_scenario(ROOT / "scenarios" / "kill-pause-join.yaml")
    assert [(f.action, f.trigger, f.when, f.targets) for f in k.failures.schedule] == [
        ("kill", "at_step", 50, (1,)), ("pause", "at_s", 8.0, (2,)), ("join", "at_s", 20.0, ()),
    ]


# -- property: any valid scenario round-trips through YAML ---------------------


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    workers = draw(st.integers(1, 64))
    spares = draw(st.integers(0, 4))
    micro = draw(st.sampled_from([1, 2, 4, 8, 16]))
    times = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
    pos = st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)
    faults: list[dict] = []
    joins = 0
    for _ in range(draw(st.integers(0, 5))):
        trigger = draw(st.sampled_from([{"at_s": draw(times)}, {"at_step": draw(st.integers(0, 10**6))}]))
        kind = draw(st.sampled_from(["kill", "pause", "join"]))
        if kind == "join":
            n = draw(st.integers(1, 3))
            joins += n
            faults.append({**trigger, "join": n})
        else:
            faults.append({**trigger, kind: "random", **({"for_s": draw(pos)} if kind == "pause" else {})})
    limit = workers + spares + joins
    for f in faults:  # aim the non-random faults at ids that exist
        if "kill" in f and draw(st.booleans()):
            f["kill"] = draw(st.lists(st.integers(0, limit - 1), min_size=1, max_size=3, unique=True))
        if "pause" in f and draw(st.booleans()):
            f["pause"] = draw(st.integers(0, limit - 1))
    hb = draw(pos)
    raw = {
        # "." and ".." would leave runs/: refused (tests/test_scenario_bounds.py)
        "name": draw(st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
                     .filter(lambda n: n not in (".", ".."))),
        "description": draw(st.text(max_size=40)),
        "seed": draw(st.integers(0, 2**63)),
        "target": draw(st.sampled_from(["sim", "real"])),
        "cluster": {"workers": workers, "spares": spares, "repair_s": draw(st.none() | pos)},
        "workload": {"micro_batch": micro, "global_batch": micro * draw(st.integers(1, 64)),
                     "micro_batch_s": draw(pos), "allreduce_s": draw(times),
                     "step_s_by_workers": draw(st.dictionaries(st.integers(1, 64), pos, max_size=3)),
                     "warmup_s": draw(times)},
        "failures": {"worker_mtbf_s": draw(st.none() | pos),
                     "distribution": draw(st.sampled_from(["exponential", "weibull"])),
                     "schedule": faults},
        "detector": {"heartbeat_s": hb, "timeout_s": hb * draw(st.floats(1.01, 100))},
        "rendezvous": {"min_workers": draw(st.integers(1, workers)),
                       "max_workers": workers + draw(st.integers(0, 8)),
                       "join_timeout_s": draw(st.none() | pos)},
        "strategy": {"kind": draw(st.sampled_from(["elastic", "checkpoint-restart"])),
                     "batch": draw(st.sampled_from(["constant", "shrink"]))},
    }
    return Scenario.model_validate(raw)


@given(scenarios())
def test_any_valid_scenario_round_trips(s: Scenario) -> None:
    assert parse_scenario(s.to_yaml()) == s
    assert s.shards_per_step * s.workload.micro_batch == s.workload.global_batch
    expected = math.ceil(s.shards_per_step / s.cluster.workers) * s.workload.micro_batch_s + s.workload.allreduce_s
    # a measured step time for the full job, where given, replaces the model
    assert s.ideal_step_s == s.workload.step_s_by_workers.get(s.cluster.workers, expected)


def test_fault_model_used_directly() -> None:
    f = KillFault(at_step=3, kill=[1, 2])
    assert f.targets == (1, 2) and f.action == "kill" and f.when == 3


# one fault of each action, with the keys it needs (hosts of 2 workers, racks of 4, an etcd
# store with a standby for the keeper's faults)
EACH_ACTION = {
    "kill": {"kill": 1}, "kill_rack": {"kill_rack": 0}, "lose_host": {"lose_host": "random"},
    "partition": {"partition": [1], "for_s": 2.0}, "isolate_keeper": {"isolate_keeper": 0, "for_s": 1.0},
    "delay": {"delay": 1, "latency_s": 0.5, "for_s": 3.0}, "loss": {"loss": 0, "rate": 0.25, "for_s": 1.0},
    "pause": {"pause": 2, "for_s": 1.5}, "slow": {"slow": "random", "factor": 3.0, "for_s": 2.0},
    "late_heartbeats": {"late_heartbeats": 3, "delay_s": 1.0, "for_s": 4.0}, "join": {"join": 2},
    "kill_keeper": {"kill_keeper": "active"}, "kill_etcd": {"kill_etcd": 1},
    "partition_keeper": {"partition_keeper": "active", "for_s": 2.0},
}
EACH_SET = ["cluster.workers=4", "cluster.workers_per_host=2", "cluster.rack_size=4",
            "keeper.store=etcd", "keeper.standbys=1"]


def _each_action(trigger: str = "at_step") -> Scenario:
    schedule = [{trigger: 3 + i, **keys} for i, keys in enumerate(EACH_ACTION.values())]
    return parse_scenario(MINIMAL, overrides=[*EACH_SET, f"failures.schedule={json.dumps(schedule)}"])


def test_each_action_is_its_own_model_holding_only_its_keys() -> None:
    sc = _each_action()
    assert tuple(EACH_ACTION) == tuple(FAULT_MODELS)
    for fault, (action, keys) in zip(sc.failures.schedule, EACH_ACTION.items()):
        assert type(fault) is FAULT_MODELS[action] and fault.action == action
        # the model's keys: the three triggers, then what this action takes and nothing more
        assert set(type(fault).model_fields) == {"at_s", "at_step", "at_roll_call", *keys}
    # how many workers each affects: newcomers, a whole domain or link as one, the hosts cut
    # off, the workers named; none for a fault of the keeper or etcd
    assert {f.action: f.count for f in sc.failures.schedule} == {
        "kill": 1, "kill_rack": 1, "lose_host": 1, "partition": 1, "isolate_keeper": 1,
        "delay": 1, "loss": 1, "pause": 1, "slow": 1, "late_heartbeats": 1, "join": 2,
        "kill_keeper": 0, "kill_etcd": 0, "partition_keeper": 0}
    # written out with the keys given, in one fixed order whatever the action
    written = sc.to_dict()["failures"]["schedule"]
    assert [list(f) for f in written] == [
        [k for k in FAULT_KEYS if k in ("at_step", *keys)] for keys in EACH_ACTION.values()]
    assert parse_scenario(sc.to_yaml()) == sc


def test_the_fault_plan_reads_what_each_fault_hits_and_its_numbers() -> None:
    plan = {f.action: f for f in scheduled_faults(_each_action("at_roll_call"))}
    hits = {action: f.targets for action, f in plan.items()}
    assert hits == {"kill": (1,), "kill_rack": 0, "lose_host": "random", "partition": (1,),
                    "isolate_keeper": 0, "delay": 1, "loss": 0, "pause": (2,), "slow": "random",
                    "late_heartbeats": (3,), "join": 2, "kill_keeper": (), "kill_etcd": 1,
                    "partition_keeper": "active"}
    numbers = ("for_s", "rate", "latency_s", "factor", "delay_s")
    for action, keys in EACH_ACTION.items():
        f = plan[action]
        assert {k: getattr(f, k) for k in numbers if getattr(f, k) is not None} == \
            {k: v for k, v in keys.items() if k in numbers}, action
    assert {f.trigger for f in plan.values()} == {"at_roll_call"}


@pytest.mark.parametrize(("fault", "where", "words"), [
    ({"at_s": 1, "kill": 1, "latency_s": 2.0}, "failures.schedule.0.latency_s",
     "only allowed with delay, not with kill"),
    ({"at_s": 1, "slow": 1, "for_s": 1.0}, "failures.schedule.0.factor", "required with slow"),
    ({"at_s": 1, "join": 1, "for_s": 1.0}, "failures.schedule.0.for_s", "only allowed with pause"),
    ({"at_s": 1, "pause": "x", "for_s": 1.0}, "failures.schedule.0.pause",
     "expected a worker id or 'random'"),
    ({"at_s": 1, "partition": [1, 1], "for_s": 1.0}, "failures.schedule.0.partition",
     "lists each host once"),
    ({"at_s": 1, "delay": 0, "latency_s": 4000.0, "for_s": 1.0}, "failures.schedule.0.latency_s",
     "must be <= 3600"),
    ({"at_s": 1, "kill_keeper": "standby"}, "failures.schedule.0.kill_keeper", "expected 'active'"),
    ({"at_s": 1, "join": 1, "kill": None, "rate": None}, None, None),
])
def test_a_faults_errors_name_the_key_without_the_model(fault: dict, where: str | None,
                                                        words: str | None) -> None:
    overrides = [*EACH_SET, f"failures.schedule=[{json.dumps(fault)}]"]
    if where is None:  # null keys are unset
        assert parse_scenario(MINIMAL, overrides=overrides).failures.schedule[0].action == "join"
        return
    with pytest.raises(ScenarioError) as info:
        parse_scenario(MINIMAL, overrides=overrides)
    assert info.value.field == where and words in info.value.message, str(info.value)


SHARDED = """
name: sharded
cluster: {workers: 6, spares: 1, rack_size: 4}
state: {sharding: sharded, replicas: 3, shards: 12}
failures:
  schedule:
    - {at_s: 1.0, kill_rack: 1}
    - {at_step: 5, kill_rack: random}
    - {at_s: 2.0, join: 2}
"""


def test_state_defaults_are_replicated_two_replicas_one_shard_per_worker() -> None:
    s = parse_scenario(MINIMAL)
    assert (s.state.sharding, s.state.replicas, s.state.shards) == ("replicated", 2, None)
    assert s.state_shards == s.cluster.workers
    assert s.cluster.rack_size is None and s.n_racks == 0
    assert s.rack_of(3) is None and s.rack_workers(0) == ()


def test_sharded_state_racks_and_kill_rack() -> None:
    s = parse_scenario(SHARDED)
    assert (s.state.sharding, s.state.replicas, s.state_shards) == ("sharded", 3, 12)
    # ids 0..8 (6 workers, 1 spare, 2 joined) in racks of 4: racks 0, 1, 2
    assert s.worker_id_limit == 9 and s.n_racks == 3
    assert [s.rack_of(w) for w in (0, 3, 4, 8)] == [0, 0, 1, 2]
    assert s.rack_workers(1) == (4, 5, 6, 7) and s.rack_workers(2) == (8,)
    f = s.failures.schedule
    assert (f[0].action, f[0].rack, f[0].targets, f[0].count) == ("kill_rack", 1, (), 1)
    assert (f[1].trigger, f[1].rack) == ("at_step", "random")
    assert f[2].rack is None
    again = parse_scenario(s.to_yaml())
    assert again == s
    assert s.to_dict()["failures"]["schedule"][0] == {"at_s": 1.0, "kill_rack": 1}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["keeper.worker_links=direct"],
         "keeper.worker_links (from --set): needs keeper.store: etcd (the workers find the keeper"),
        (["keeper.worker_links=sideways"], "keeper.worker_links"),
        (["keeper.store=etcd", "keeper.worker_links=direct", "cluster.workers_per_host=2",
          "failures.schedule=[{at_step: 3, partition: [0], for_s: 1}]"],
         "not built with keeper.worker_links: direct yet"),
        (["keeper.store=etcd", "keeper.worker_links=direct", "cluster.workers_per_host=2",
          "keeper.etcd_endpoints=[http://127.0.0.1:2379]"],
         "a host's namespace does not reach your cluster"),
    ],
)
def test_direct_worker_links_need_etcd_and_no_link_faults(overrides: list[str],
                                                          fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(MINIMAL, "s.yaml", overrides=overrides)
    assert "\n" not in str(info.value) and fragment in str(info.value), str(info.value)


def test_direct_worker_links_with_etcd_are_accepted() -> None:
    s = parse_scenario(MINIMAL, overrides=["keeper.store=etcd", "keeper.worker_links=direct"])
    assert s.keeper.worker_links == "direct"
    assert parse_scenario(MINIMAL).keeper.worker_links == "launcher"
