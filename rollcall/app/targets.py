"""The targets and their drivers: the one place the app looks a driver up.

Why one place: the app (``rollcall/``) never imports a driver (``sim/``,
``real/``) at module level, so ``import rollcall`` stays cheap and a machine
without torch still runs the sim. Every lookup of a driver goes through this
module, by the package named in :data:`DRIVERS`, and only when called
(``tests/test_purity.py`` allows ``importlib.import_module`` of a driver
nowhere else).

The registry is a plain dict of package names, not packaging entry points:
an entry point lives in the installed metadata, so adding one would break
every editable install until it is redone, and both drivers ship in this
distribution anyway.

Each lookup imports by name at call time (``importlib.import_module``
reads ``sys.modules``), so a module a test puts in place of
``<target>.driver``, or an attribute it patches, is what the app gets.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, cast

if TYPE_CHECKING:
    from rollcall.scenario import Scenario

__all__ = ["DRIVERS", "TARGETS", "Driver", "NotBuilt", "UnknownTarget", "device_problem",
           "driver", "etcd_binary", "etcd_cluster_problem", "ledger_samples", "netns_problem",
           "serve_host"]

#: target name -> the package of its driver
DRIVERS: dict[str, str] = {"sim": "sim", "real": "real"}
TARGETS: tuple[str, ...] = tuple(DRIVERS)


class UnknownTarget(ValueError):
    """A target name not in :data:`DRIVERS`; ``str()`` is one line."""


class NotBuilt(RuntimeError):
    """A known target whose driver lacks the part asked for; ``str()`` is one line."""


class Driver(Protocol):
    """What ``<target>.driver`` offers the app (``sim/driver.py``, ``real/driver.py``)."""

    def run(self, scenario: Scenario, out_dir: Path, **options: Any) -> dict[str, Any]:
        """Run one resolved scenario into ``out_dir``; its summary."""


def _module(target: str, module: str) -> Optional[ModuleType]:
    """``<package>.<module>`` of the target, or None when that module does not exist.

    Only a missing module means "not built"; an import error raised *inside*
    an existing driver module is a bug and propagates.
    """
    if target not in DRIVERS:
        raise UnknownTarget(f"unknown target {target!r} (one of {', '.join(TARGETS)})")
    package = DRIVERS[target]
    name = f"{package}.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name in (package, name):
            return None
        raise


def _part(target: str, module: str, attr: str) -> Optional[Callable[..., Any]]:
    """The callable ``<package>.<module>.<attr>``, or None where the target has none."""
    mod = _module(target, module)
    fn = getattr(mod, attr, None) if mod is not None else None
    return fn if callable(fn) else None


def driver(target: str) -> Driver:
    """The target's driver module; :class:`NotBuilt` when it has none or no ``run``."""
    mod = _module(target, "driver")
    if mod is None or not callable(getattr(mod, "run", None)):
        raise NotBuilt(f"target '{target}' is not built yet")
    return cast(Driver, mod)


def ledger_samples(target: str) -> int:
    """Up to how many samples a run of the target writes one ledger record per
    member per step (its driver's ``LEDGER_SAMPLES``); 0, the compact ledger
    throughout, for a driver without the constant."""
    mod = _module(target, "driver")
    return int(getattr(mod, "LEDGER_SAMPLES", 0)) if mod is not None else 0


def netns_problem() -> Optional[str]:
    """Why the real target cannot build its hosts' network namespaces here (one line), or None."""
    fn = _part("real", "netns", "netns_available")
    return None if fn is None else fn()


def device_problem(scenario: Scenario) -> Optional[str]:
    """Why the real target cannot run ``scenario`` on this machine's devices (one line), or None."""
    fn = _part("real", "device", "device_problem")
    return None if fn is None else fn(scenario)


def etcd_binary() -> Optional[str]:
    """The etcd server's path, or None where it is not installed (or the real
    target is not built)."""
    fn = _part("real", "etcd", "etcd_binary")
    return None if fn is None else fn()


def etcd_cluster_problem(endpoints: Sequence[str], user: Optional[str],
                         password_file: Optional[str]) -> Optional[str]:
    """Why the real target's keeper cannot keep its record in the user's etcd
    cluster at ``endpoints`` with these credentials (one line), or None."""
    fn = _part("real", "keeper_store", "cluster_problem")
    if fn is None:
        raise NotBuilt("target 'real' is not built yet (no real.keeper_store)")
    return fn(endpoints, user, password_file)


def serve_host(keeper: tuple[str, int], token_file: str, host: int) -> int:
    """Run the real target's host agent of host ``host`` (``rollcall host``); its exit status."""
    fn = _part("real", "host", "serve")
    if fn is None:
        raise NotBuilt("target 'real' is not built yet (no real.host)")
    return int(fn(keeper, token_file, host))
