"""The layering rules (README, "How it works" and "Layout"), enforced by folder.

* ``rollcall/core/`` (the sans-IO core) imports only the standard library's
  pure modules and itself: no clock, randomness, socket, thread, process,
  file system, and no third-party package (numpy, yaml, pydantic, pandas,
  simpy, torch). Checked on the source, so a lazy import counts too, and in
  a fresh interpreter (importing the core loads none of them).
* The core has an explicit public API (``__all__``), and the drivers
  (``sim/``, ``real/``) use only it: ``from rollcall.core import X`` with X
  in ``__all__``, never a submodule.
* ``rollcall/`` above the core and the drivers never import each other the
  wrong way: app -> core, sim -> rollcall, real -> rollcall, never sim <-> real.

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
CORE = ROOT / "rollcall" / "core"
# Standard-library modules the core may use: pure computation and types.
CORE_STDLIB = {
    "__future__", "bisect", "collections", "dataclasses", "enum", "fractions", "functools",
    "hashlib", "heapq", "itertools", "math", "operator", "re", "struct", "typing",
}


def _imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every import in ``path`` as (absolute module, names imported from it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = list(path.relative_to(ROOT).parent.parts)
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level == 0:
                out.append((node.module or "", names))
            else:
                base = package[: len(package) - node.level + 1]
                out.append((".".join(base + (node.module.split(".") if node.module else [])), names))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append((node.args[0].value, ()))
    return out


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


@pytest.mark.parametrize("path", _files(CORE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_imports_only_pure_stdlib_and_the_core(path: Path) -> None:
    bad = sorted({m for m, _ in _imports(path)
                  if not (m == "rollcall.core" or m.startswith("rollcall.core.")
                          or m.split(".")[0] in CORE_STDLIB)})
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}; the core is sans-IO, stdlib only"


def test_importing_the_core_loads_no_outside_package() -> None:
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import rollcall.core\n"
        "new = sorted(m for m in set(sys.modules) - before if '.' not in m\n"
        "             and m not in sys.stdlib_module_names and m != 'rollcall')\n"
        "print(json.dumps(new))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_core_public_api_is_explicit_and_complete() -> None:
    import rollcall.core as core

    assert core.__all__ and len(set(core.__all__)) == len(core.__all__)
    missing = [n for n in core.__all__ if not hasattr(core, n)]
    assert not missing, missing


@pytest.mark.parametrize("driver", ["sim", "real"])
def test_drivers_use_only_the_core_public_api(driver: str) -> None:
    import rollcall.core as core

    public = set(core.__all__)
    offenders = []
    for p in _files(ROOT / driver):
        for module, names in _imports(p):
            if module.startswith("rollcall.core."):
                offenders.append(f"{p.relative_to(ROOT)}: imports {module}")
            elif module == "rollcall.core":
                offenders += [f"{p.relative_to(ROOT)}: {n} is not in rollcall.core.__all__"
                              for n in names if n not in public]
    assert not offenders, offenders


@pytest.mark.parametrize("driver, other", [("sim", "real"), ("real", "sim")])
def test_drivers_do_not_import_each_other(driver: str, other: str) -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _files(ROOT / driver)
                 if any(m.split(".")[0] == other for m, _ in _imports(p))]
    assert not offenders, f"{driver}/ must not import {other}: {offenders}"


def test_rollcall_does_not_import_drivers() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _files(ROOT / "rollcall")
                 if any(m.split(".")[0] in {"sim", "real"} for m, _ in _imports(p))]
    assert not offenders, f"rollcall/ must not import sim or real: {offenders}"


def test_import_scanner_catches_violations(tmp_path: Path, monkeypatch) -> None:
    # The scanner itself must be able to fail, or the tests above prove nothing.
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    pkg = tmp_path / "rollcall" / "core"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("import time\nfrom real.driver import run\n")
    (pkg / "b.py").write_text("from .. import results\nfrom .keeper import Keeper\n")
    (pkg / "c.py").write_text("def f():\n    import numpy\n    __import__('os')\n")
    assert {m for m, _ in _imports(pkg / "a.py")} == {"time", "real.driver"}
    assert {m for m, _ in _imports(pkg / "b.py")} == {"rollcall", "rollcall.core.keeper"}
    assert {m for m, _ in _imports(pkg / "c.py")} == {"numpy", "os"}
