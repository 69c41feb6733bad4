"""Scale helpers: other ways to say a size, resolved into the canonical keys.

A person sizing a job thinks in GPUs, in "at least 90% of the nodes", in a
per-GPU batch and in failures per 1,000 node-days (how Meta's Llama-3
report gives them). Each helper is an alternative spelling of one
canonical key, resolved in the raw mapping before validation and then
dropped: the resolved scenario (``validate``, a run's scenario.yaml, the
sweep's staleness hash) holds the canonical keys only, so a run made from
``cluster.gpus: 64`` and one from ``cluster.workers: 8`` are the same run.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from rollcall.scenario.base import Problem, show
from rollcall.scenario.sections import Cluster

#: helper key -> the canonical key it is an alternative to, per section. An
#: override (``--set``, ``--gpus``, a sweep's grid) of either one replaces
#: the other (see :func:`drop_alternative`); within one layer both may not
#: be given (``cluster.gpus`` and ``cluster.workers`` may, when they agree).
SCALE_HELPERS: dict[str, dict[str, str]] = {
    "cluster": {"gpus": "workers"},
    "workload": {"per_worker_batch": "global_batch"},
    "failures": {"per_1000_node_days": "worker_mtbf_s"},
}
#: seconds in 1,000 days: ``worker_mtbf_s = NODE_DAYS_S / per_1000_node_days``
NODE_DAYS_S = 1000 * 86_400
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pos_int(value: Any, where: tuple[str | int, ...], what: str) -> int:
    if not _is_int(value) or value < 1:
        raise Problem(where, f"expected {what} (an integer >= 1), got {show(value)}")
    return value


def resolve_scale(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every scale helper turned into its canonical key (a new mapping).

    Sections that are not mappings are left for validation to report.
    """
    out = dict(data)
    sections = {k: dict(out[k]) for k in SCALE_HELPERS if isinstance(out.get(k), dict)}
    if "cluster" in sections:
        _resolve_gpus(sections["cluster"])
    if "failures" in sections:
        _resolve_rate(sections["failures"])
    out.update(sections)
    cluster = out.get("cluster", {})
    workers = cluster.workers if isinstance(cluster, Cluster) else (
        cluster.get("workers", Cluster().workers) if isinstance(cluster, dict)
        else Cluster().workers if cluster is None else None)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        # cluster.workers itself is reported; what depends on it cannot be checked
        for section, key in (("workload", "per_worker_batch"), ("rendezvous", "min_workers"),
                             ("rendezvous", "max_workers")):
            node = out.get(section)
            if isinstance(node, dict) and key in node and (
                    key == "per_worker_batch" or not _is_int(node[key])):
                out[section] = {k: v for k, v in node.items() if k != key}
        return out
    if "workload" in sections:
        _resolve_batch(sections["workload"], workers)
    if isinstance(out.get("rendezvous"), dict):
        out["rendezvous"] = _resolve_fractions(dict(out["rendezvous"]), workers)
    return out


def _resolve_gpus(cluster: dict[str, Any]) -> None:
    """``cluster.gpus`` -> ``cluster.workers`` (gpus / gpus_per_worker, a whole number)."""
    if cluster.get("gpus") is None:
        cluster.pop("gpus", None)
        return
    gpus = _pos_int(cluster.pop("gpus"), ("cluster", "gpus"), "a GPU count")
    per = cluster.get("gpus_per_worker", Cluster().gpus_per_worker)
    if not _is_int(per) or per < 1:
        return  # cluster.gpus_per_worker itself is reported
    if gpus % per:
        raise Problem(("cluster", "gpus"), f"must be a multiple of cluster.gpus_per_worker={per} "
                       f"(whole workers), got {gpus}")
    workers = cluster.get("workers")
    if workers is not None and workers != gpus // per:
        raise Problem(("cluster", "gpus"), f"{gpus} GPUs are {gpus // per} workers of "
                       f"{per} GPUs, but cluster.workers={show(workers)}; give one of the two")
    cluster["workers"] = gpus // per


def _resolve_rate(failures: dict[str, Any]) -> None:
    """``failures.per_1000_node_days`` -> ``failures.worker_mtbf_s`` (1,000 days / rate)."""
    if failures.get("per_1000_node_days") is None:
        failures.pop("per_1000_node_days", None)
        return
    rate = failures.pop("per_1000_node_days")
    where = ("failures", "per_1000_node_days")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise Problem(where, f"expected a failure rate (a finite number > 0), got {show(rate)}")
    if failures.get("worker_mtbf_s") is not None:
        raise Problem(where, "give either failures.per_1000_node_days or failures.worker_mtbf_s, "
                       "not both (one is the other: worker_mtbf_s = 86,400,000 s / rate)")
    failures["worker_mtbf_s"] = NODE_DAYS_S / rate


def _resolve_batch(workload: dict[str, Any], workers: int) -> None:
    """``workload.per_worker_batch`` -> ``workload.global_batch`` (per worker x workers)."""
    if workload.get("per_worker_batch") is None:
        workload.pop("per_worker_batch", None)
        return
    where = ("workload", "per_worker_batch")
    per = _pos_int(workload.pop("per_worker_batch"), where, "samples per worker per step")
    if workload.get("global_batch") is not None:
        raise Problem(where, "give either workload.per_worker_batch or workload.global_batch, "
                       "not both (global_batch = per_worker_batch x cluster.workers)")
    workload["global_batch"] = per * workers


def _resolve_fractions(rdv: dict[str, Any], workers: int) -> dict[str, Any]:
    """Fractions of ``cluster.workers`` in ``min_workers``/``max_workers`` -> counts.

    One rule: an integer is a count; a float in (0, 1] or a percentage
    string in (0%, 100%] is a fraction of the initial workers (torchrun's
    ``--nnodes MIN:MAX`` spelt relative to the job). Rounded inwards, so the
    bound written always holds: ``min_workers`` up (90% of 10.5 workers
    means 10, never fewer than 90%), ``max_workers`` down (never more than
    the share written). Exact arithmetic: ``0.9`` is 9/10, not 0.900...02.
    """
    for key, up in (("min_workers", True), ("max_workers", False)):
        value = rdv.get(key)
        if value is None or _is_int(value):
            continue
        where = ("rendezvous", key)
        share = _fraction(value, where)
        count = math.ceil(share * workers) if up else math.floor(share * workers)
        said = f"{show(value)} of cluster.workers={workers} is {count} (rounded {'up' if up else 'down'})"
        if count < 1:
            raise Problem(where, f"{said}: must be >= 1 worker")
        if not up and count < workers:
            raise Problem(where, f"{said}: must be >= cluster.workers={workers} (a fraction of "
                           "max_workers can only be 1.0 or '100%'; give a count to let the job grow)")
        rdv[key] = count
    return rdv


def _fraction(value: Any, where: tuple[str | int, ...]) -> Fraction:
    """The exact share a float in (0, 1] or a 'P%' string says; a Problem otherwise."""
    expected = ("expected a worker count (an integer >= 1), a fraction of cluster.workers in "
                f"(0, 1] or a percentage such as '90%', got {show(value)}")
    if isinstance(value, float):
        share = Fraction(repr(value)) if math.isfinite(value) else Fraction(-1)
    elif isinstance(value, str) and _PERCENT.match(value):
        share = Fraction(_PERCENT.match(value).group(1)) / 100  # type: ignore[union-attr]
    else:
        raise Problem(where, expected)
    if not 0 < share <= 1:
        raise Problem(where, f"{expected} (a fraction is at most 1; write an integer for a count)")
    return share


def drop_alternative(raw: dict[str, Any], parts: tuple[str, ...]) -> None:
    """After an override of ``parts``, forget the key it is an alternative to.

    ``--set cluster.gpus=64`` (or ``--gpus 64``, or a sweep's grid) on a file
    that says ``cluster.workers: 4`` means 64 GPUs: the later word wins, as
    for any override, instead of a conflict between two layers.
    """
    if len(parts) != 2 or parts[0] not in SCALE_HELPERS:
        return
    section, key = parts
    pairs = SCALE_HELPERS[section]
    other = pairs.get(key) or next((h for h, c in pairs.items() if c == key), None)
    node = raw.get(section)
    if other is not None and isinstance(node, dict):
        node.pop(other, None)


