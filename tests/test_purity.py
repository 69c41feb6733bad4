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
  A driver imports only the rollcall modules in ``DRIVER_MAY_IMPORT`` (no
  part of the CLI, the sweeps or the engines), and the app finds a driver
  only through its registry, ``rollcall/app/targets.py``: nowhere else in
  ``rollcall/`` is a driver imported by a name in a string.
* No import circle among the modules of ``rollcall/``, ``sim/`` or ``real/``
  (imports inside functions and under ``TYPE_CHECKING`` count).

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
DRIVERS = ("sim", "real")
# The rollcall modules a driver may import; the core only as ``from rollcall.core import X``
# with X in its __all__ (test_drivers_use_only_the_core_public_api).
DRIVER_MAY_IMPORT = {
    "rollcall.core", "rollcall.config", "rollcall.scenario", "rollcall.results",
    "rollcall.interrupts", "rollcall.cli_args",
}
# The one file of rollcall/ that may import a driver by a name in a string.
REGISTRY = "rollcall/app/targets.py"
# Files of rollcall/ that import modules they are handed by name (never a driver's).
NAME_LOADERS = {"rollcall/app/engines/base.py"}  # an engine's task, "module:function"


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> set[str]:
    """Every module of ``rollcall/``, ``sim/`` and ``real/``, packages included."""
    return {_module_name(p) for top in ("rollcall", *DRIVERS) for p in _files(ROOT / top)}


def _targets(path: Path, modules: set[str]) -> set[str]:
    """The modules ``path`` imports. ``from pkg import name`` is ``pkg.name`` when that
    is a module, else ``pkg``: a package's lazy ``__getattr__`` (``rollcall/__init__.py``)
    is then no import of every module that writes ``from rollcall import X``."""
    out: set[str] = set()
    for module, names in _imports(path):
        subs = {f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names}
        out |= subs or {module}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the three folders it imports, at any depth of its code."""
    modules = _modules()
    return {_module_name(p): (_targets(p, modules) & modules) - {_module_name(p)}
            for top in ("rollcall", *DRIVERS) for p in _files(ROOT / top)}


def _driver_lookups(path: Path, named_anything: bool = False) -> list[str]:
    """Calls in ``path`` that import a module by a name in a string: a literal under
    ``sim``/``real``, or any name not written out (a variable, an f-string, a sum),
    which may be a driver's, unless ``named_anything`` (a loader of whatever module
    it is handed, such as ``rollcall.app.engines.base.load_fn``'s task functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and (
                getattr(node.func, "id", None) or getattr(node.func, "attr", None)) in {
                "import_module", "__import__"}):
            continue
        arg = node.args[0]
        literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        if (arg.value.split(".")[0] in DRIVERS) if literal else not named_anything:
            out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return out


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


def test_only_the_registry_imports_a_driver_by_name() -> None:
    rel = {p: p.relative_to(ROOT).as_posix() for p in _files(ROOT / "rollcall")}
    offenders = [f"{rel[p]} {hit}" for p in rel if rel[p] != REGISTRY
                 for hit in _driver_lookups(p, rel[p] in NAME_LOADERS)]
    assert not offenders, f"look drivers up through {REGISTRY}: {offenders}"


@pytest.mark.parametrize("driver", DRIVERS)
def test_drivers_import_no_app_module(driver: str) -> None:
    modules = _modules()
    offenders = sorted({f"{p.relative_to(ROOT)}: {m}" for p in _files(ROOT / driver)
                        for m in _targets(p, modules)
                        if m.split(".")[0] == "rollcall" and m not in DRIVER_MAY_IMPORT})
    assert not offenders, f"{driver}/ may import only {sorted(DRIVER_MAY_IMPORT)}: {offenders}"


def test_rollcall_has_no_import_circle() -> None:
    cycles = [sorted(c) for c in _cycles(_import_graph()) if any(
        m.split(".")[0] == "rollcall" for m in c)]
    assert not cycles, f"import circles in rollcall/: {cycles}"


def test_drivers_have_no_import_circle() -> None:
    cycles = [sorted(c) for c in _cycles(_import_graph())
              if next(iter(c)).split(".")[0] in DRIVERS]
    assert not cycles, f"import circles in the drivers: {cycles}"


def test_graph_scanners_catch_violations(tmp_path: Path, monkeypatch) -> None:
    # As above: the circle finder and the lookup finder must be able to fail.
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    app, sim = tmp_path / "rollcall", tmp_path / "sim"
    app.mkdir()
    sim.mkdir()
    (app / "__init__.py").write_text("def __getattr__(name):\n    from rollcall import a\n")
    (app / "a.py").write_text("from rollcall import b, c\n")  # b, c: modules, not the package
    (app / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from rollcall.a import X\n")
    (app / "c.py").write_text("import importlib\n"
                              "def f(t):\n    importlib.import_module(f'{t}.driver')\n"
                              "    __import__('real.etcd')\n    importlib.import_module(t)\n"
                              "    importlib.import_module('json')\n")
    (sim / "driver.py").write_text("def f():\n    from sim import gray\n")
    (sim / "gray.py").write_text("import sim.driver\nfrom rollcall.app.cli import main\n")
    graph = _import_graph()
    assert graph["rollcall.a"] == {"rollcall.b", "rollcall.c"}
    assert graph["rollcall"] == {"rollcall.a"}
    assert set(_cycles(graph)) == {frozenset({"rollcall.a", "rollcall.b"}),
                                   frozenset({"sim.driver", "sim.gray"})}
    lines = [h.split(":")[0] for h in _driver_lookups(app / "c.py")]
    assert lines == ["line 3", "line 4", "line 5"]  # f-string, literal, variable
    assert [h.split(":")[0] for h in _driver_lookups(app / "c.py", True)] == ["line 4"]
    assert "rollcall.app.cli" in _targets(sim / "gray.py", _modules())
