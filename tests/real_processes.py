"""The marks every test that starts real worker processes carries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

needs_pidfd = pytest.mark.skipif(not hasattr(os, "pidfd_open"),
                                 reason="the real target's launcher needs Linux pidfds")
# one real run at a time: two would put 8+ torch processes on 2 cores and
# starve heartbeats into false evictions (the group is a lock across xdist
# workers: tests/conftest.py; --dist loadgroup alone does not hold it here)
one_real_run_at_a_time = pytest.mark.xdist_group("real-processes")
REAL_PROCESSES = [needs_pidfd, one_real_run_at_a_time]


def shared_tmp_root(factory: pytest.TempPathFactory) -> Path:
    """The temporary root every xdist worker of this test run shares (one
    process: its own base temp): the real-process lock lives there, and what
    tests keep for the whole run."""
    root = factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") is not None else root
