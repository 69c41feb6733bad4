"""Shared pytest set-up: hypothesis profiles.

``dev`` (default) keeps the local loop quick; ``ci`` searches harder, never
fails on a slow example and prints the blob needed to reproduce a failure.
Pick one with ``HYPOTHESIS_PROFILE`` (the Makefile sets ``ci`` when ``CI`` is set).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=100)
settings.register_profile("ci", max_examples=500, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The scenario fuzz searches from one seed per test run, chosen here before
# any xdist worker starts (they inherit the environment), and shown in the
# run's header: a run stopped from outside (a CI time limit) still names it.
FUZZ_SEED_ENV = "ROLLCALL_FUZZ_SEED"


def pytest_configure(config) -> None:
    if not os.environ.get(FUZZ_SEED_ENV):
        import random
        os.environ[FUZZ_SEED_ENV] = str(random.SystemRandom().randrange(2**32))


def pytest_report_header(config) -> str:
    return f"scenario fuzz seed: {FUZZ_SEED_ENV}={os.environ[FUZZ_SEED_ENV]}"


# -- one real run at a time ----------------------------------------------------------
#
# Tests that start real worker processes carry ``xdist_group("real-processes")``
# (tests/real_processes.py): two real runs at once would put 8+ torch processes
# on 2 cores and starve heartbeats into false evictions. ``--dist loadgroup``
# was to keep them on one xdist worker, but with pytest 9.2 and xdist 3.8 it
# does not (xdist renames ``item._nodeid``, which pytest 9 no longer reads:
# measured, two real runs side by side in one CI run). So the group is also
# a lock: each such test holds an exclusive flock on a file in the run's
# shared temporary root for its whole protocol (setup, module fixtures that
# start real runs included, call, teardown).

import fcntl  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Callable, Iterator  # noqa: E402

import pytest  # noqa: E402

from real_processes import shared_tmp_root  # noqa: E402
from shipped_runs import Pair, pair_of  # noqa: E402

REAL_GROUP = "real-processes"


def _in_real_group(item: pytest.Item) -> bool:
    return any((m.args[:1] or (m.kwargs.get("name"),))[0] == REAL_GROUP
               for m in item.iter_markers("xdist_group"))


@contextmanager
def _real_lock(config: pytest.Config) -> Iterator[None]:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: nothing to share
        yield
        return
    root = shared_tmp_root(config._tmp_path_factory)
    with open(root / "real-processes.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # bounded: each holder's own test timeout
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not _in_real_group(item):
        return (yield)
    with _real_lock(item.config):
        return (yield)


@pytest.fixture(scope="session")
def shipped_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Pair]:
    """``shipped_runs(name, *overrides)``: that scenario's pair of runs, sim
    and real, made once per test run (tests/shipped_runs.py)."""
    def get(name: str, *overrides: str) -> Pair:
        return pair_of(tmp_path_factory, name, *overrides)

    return get
