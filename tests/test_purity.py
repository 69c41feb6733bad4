"""The layering rules of DESIGN.md, enforced.

* The core imports neither simpy nor torch (checked in a fresh interpreter).
* The core reads no clock, draws no global randomness, opens no socket and
  starts no thread: only ``cli.py``, ``__main__.py``, ``results.py`` and
  ``sweep.py`` (a process pool over runs; it decides nothing about membership)
  may import such modules (checked on the source, so a lazy import counts too).
* ``sim`` and ``real`` never import each other.

Modules are discovered from the tree, so new files are covered automatically.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "rollcall"
EDGE = {"cli.py", "__main__.py", "results.py", "sweep.py"}  # may touch clocks and the outside
FORBIDDEN_IN_CORE = {
    "time", "random", "socket", "threading", "asyncio", "multiprocessing",
    "subprocess", "simpy", "torch", "datetime", "secrets", "uuid", "concurrent",
}


def _core_modules() -> list[str]:
    names = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] in {"cli", "__main__"}:
            continue
        names.append(".".join(parts))
    return names


def _imported_roots(path: Path, root: Path) -> set[str]:
    """Top-level package of every import in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = list(path.relative_to(root).parent.parts)
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                roots.add((node.module or "").split(".")[0])
                continue
            base = package[: len(package) - node.level + 1]
            full = base + (node.module.split(".") if node.module else [])
            if full:
                roots.add(full[0])
            else:  # `from .. import x` at the top: x is the package
                roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                roots.add(node.args[0].value.split(".")[0])
    roots.discard("")
    return roots


def test_core_modules_are_found() -> None:
    modules = _core_modules()
    assert "rollcall" in modules and "rollcall.scenario" in modules and "rollcall.results" in modules


def test_core_imports_no_simpy_or_torch() -> None:
    modules = _core_modules()
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in ('simpy', 'torch', 'sim', 'real') if m in sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def _core_files() -> list[Path]:
    return [p for p in sorted(CORE.rglob("*.py")) if p.name not in EDGE or p.parent != CORE]


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_is_sans_io(path: Path) -> None:
    bad = _imported_roots(path, ROOT) & FORBIDDEN_IN_CORE
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}; the core is sans-IO"


@pytest.mark.parametrize("driver, other", [("sim", "real"), ("real", "sim")])
def test_drivers_do_not_import_each_other(driver: str, other: str) -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / driver).rglob("*.py"))
        if other in _imported_roots(p, ROOT)
    ]
    assert not offenders, f"{driver}/ must not import {other}: {offenders}"


def test_core_does_not_import_drivers() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in sorted(CORE.rglob("*.py"))
        if _imported_roots(p, ROOT) & {"sim", "real"}
    ]
    assert not offenders, f"rollcall/ must not import sim or real: {offenders}"


def test_import_scanner_catches_violations(tmp_path: Path) -> None:
    # The scanner itself must be able to fail, or the tests above prove nothing.
    pkg = tmp_path / "sim"
    pkg.mkdir()
    (pkg / "a.py").write_text("import time\nfrom real.driver import run\n")
    (pkg / "b.py").write_text("from .. import real\n")
    (pkg / "c.py").write_text("def f():\n    import random\n    __import__('torch')\n")
    assert {"time", "real"} <= _imported_roots(pkg / "a.py", tmp_path)
    assert "real" in _imported_roots(pkg / "b.py", tmp_path)
    assert {"random", "torch"} <= _imported_roots(pkg / "c.py", tmp_path)
