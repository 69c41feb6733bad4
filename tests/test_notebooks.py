"""Every notebook in notebooks/ executes from a clean state, and none is committed with outputs.

Each notebook makes its own runs (small sweeps on the sim, one short real
run) under ``$ROLLCALL_RUNS``, pointed here at a temporary directory, so
nothing is written into the repository. Budget: about a minute each on two
cores; the whole set must stay under 5 minutes in CI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"checkpoint_vs_elastic.ipynb", "real_run_timeline.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.timeout(240)
@pytest.mark.xdist_group("real-processes")  # the timeline notebook starts a real run
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLCALL_RUNS", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("ROLLCALL_JOBS", os.environ.get("ROLLCALL_JOBS", "2"))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=200, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(f.is_file() for f in tmp_path.rglob("summary.json")), "the notebook made no run"
