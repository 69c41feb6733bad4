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
    _name_the_group_file(config)


def pytest_report_header(config) -> str:
    return f"scenario fuzz seed: {FUZZ_SEED_ENV}={os.environ[FUZZ_SEED_ENV]}"


# -- one real run at a time ----------------------------------------------------------
#
# Tests that start real worker processes carry ``xdist_group("real-processes")``
# (tests/real_processes.py): two real runs at once would put 8+ torch processes
# on 2 cores and starve heartbeats into false evictions. ``--dist loadgroup``
# should send the whole group to one xdist worker, as one unit of work, and the
# rest to either; but xdist 3.8 marks a group by renaming ``item._nodeid``,
# which pytest 9 no longer reads, so every test would be a unit of its own and
# a worker holding a real test would wait for the other's, idle. So the group
# is made here: each worker writes the ids of the group's tests to a file the
# controller named (``REAL_IDS_ENV``), and the controller's scheduler
# (``pytest_xdist_make_scheduler``) reads it and makes them one unit. The
# group is also a lock, for any other way of running the tests: each such test
# holds an exclusive flock on a file in the run's shared temporary root for
# its whole protocol (setup, module fixtures that start real runs included,
# call, teardown).

import fcntl  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

import pytest  # noqa: E402

from real_processes import shared_tmp_root  # noqa: E402
from shipped_runs import Pair, pair_of  # noqa: E402

REAL_GROUP = "real-processes"
_GROUPS_FOLDER = pytest.StashKey[str]()
REAL_IDS_ENV = "ROLLCALL_REAL_TEST_IDS"  # the file of the group's test ids


def _in_real_group(item: pytest.Item) -> bool:
    return any((m.args[:1] or (m.kwargs.get("name"),))[0] == REAL_GROUP
               for m in item.iter_markers("xdist_group"))


def _controls_workers(config: pytest.Config) -> bool:
    """This process is the xdist controller of a ``--dist loadgroup`` run."""
    return (os.environ.get("PYTEST_XDIST_WORKER") is None
            and config.pluginmanager.hasplugin("xdist")
            and config.getoption("dist", "no") == "loadgroup")


def _name_the_group_file(config: pytest.Config) -> None:
    """The controller names the file of the group's test ids (the workers,
    started after, inherit the name); removed at the end (pytest_unconfigure)."""
    if _controls_workers(config) and not os.environ.get(REAL_IDS_ENV):
        folder = tempfile.mkdtemp(prefix="rollcall-test-groups-")
        config.stash[_GROUPS_FOLDER] = folder
        os.environ[REAL_IDS_ENV] = os.path.join(folder, "real-ids")  # the workers inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_GROUPS_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(REAL_IDS_ENV, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(REAL_IDS_ENV)
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not path:
        return
    ids = "".join(f"{item.nodeid}\n" for item in items if _in_real_group(item))
    tmp = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"  # every worker writes the same ids
    Path(tmp).write_text(ids)
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the real-process tests as one unit of work."""
    path = os.environ.get(REAL_IDS_ENV)
    if not _controls_workers(config) or not path:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class RealGroupScheduling(LoadGroupScheduling):
        real: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.real is None:  # written by the workers before their collection finished
                file = Path(path)
                self.real = set(file.read_text().splitlines()) if file.exists() else set()
            return REAL_GROUP if nodeid in self.real else nodeid

    return RealGroupScheduling(config, log)


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
