"""Every notebook in notebooks/ executes from a clean state, and none is committed with outputs.

Each notebook reads the user's run directories through one cell tagged
``parameters`` (the papermill convention) and, when they are absent, makes
its own runs (small sweeps on the sim, one short real run) there. Here a
cell after it sets ``RUNS_DIR`` to a temporary directory, as papermill's
injected cell would, and ``$ROLLCALL_RUNS`` points elsewhere: every run must
land where the parameter says, and nothing in the repository. Budget: about
a minute each on two cores; the whole set must stay under 5 minutes in CI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REAL_RUN = "real_run_timeline.ipynb"  # the one notebook that starts real processes
# its sweep runs two processes for minutes: one at a time with the real runs
# (the others run beside them, sweeping in one process, as one CPU hog would)
ONE_AT_A_TIME = (REAL_RUN, "airesim_reproduction.ipynb")


def test_there_are_notebooks() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"checkpoint_vs_elastic.ipynb", REAL_RUN} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip outputs"


def _parameters_cells(nb: "nbformat.NotebookNode") -> list[int]:
    return [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_one_parameters_cell(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    cells = _parameters_cells(nb)
    assert len(cells) == 1, f"{path.name}: one cell tagged parameters, not {len(cells)}"
    cell = nb.cells[cells[0]]
    assert cell.cell_type == "code" and "RUNS_DIR = None" in cell.source
    # literals only, so papermill (or the user) can override it by a cell after it
    assert "import" not in cell.source


def _executed(path: Path) -> object:
    """``path`` as a case of :func:`test_notebook_executes`, in the group of
    real-process tests (one at a time) or not (see ``ONE_AT_A_TIME``)."""
    if path.name in ONE_AT_A_TIME:
        return pytest.param(path, marks=pytest.mark.xdist_group("real-processes"), id=path.name)
    return pytest.param(path, id=path.name)


# the longest cell (airesim_reproduction's six 256-day runs, about a minute of
# CPU each, two at a time) takes about 200 s on two cores: room for a CPU hog
CELL_TIMEOUT_S = 400


@pytest.mark.timeout(CELL_TIMEOUT_S + 80)
@pytest.mark.slow  # each notebook runs its scenarios
@pytest.mark.parametrize("path", [_executed(p) for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLCALL_RUNS", str(tmp_path / "env"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    jobs = "2" if path.name in ONE_AT_A_TIME else "1"
    monkeypatch.setenv("ROLLCALL_JOBS", os.environ.get("ROLLCALL_JOBS", jobs))
    nb = nbformat.read(path, as_version=4)
    (params,) = _parameters_cells(nb)
    runs_dir = tmp_path / "mine"
    nb.cells.insert(params + 1, nbformat.v4.new_code_cell(
        f"RUNS_DIR = {str(runs_dir)!r}", metadata={"tags": ["injected-parameters"]}))
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert nb.cells[params].execution_count is not None, "the parameters cell ran"
    assert any(f.is_file() for f in runs_dir.rglob("summary.json")), "no run in RUNS_DIR"
    assert not (tmp_path / "env").exists(), "RUNS_DIR given: $ROLLCALL_RUNS is not used"
