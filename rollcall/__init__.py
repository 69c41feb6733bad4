"""rollcall: a fault-injection and simulation testbed for elastic data-parallel training.

``import rollcall`` is cheap: the Python API (:func:`run`, :func:`compare`,
:func:`sweep`, :func:`resolve`, in :mod:`rollcall.app.api`) is loaded on first use, and the
drivers (``sim``, ``real``) only inside a run, so the sans-IO core and the
drivers that import it never pay for pydantic or pandas through this file.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Compared", "Summary", "Swept", "compare", "resolve", "run", "sweep"]


def __getattr__(name: str) -> Any:
    # PEP 562: ``rollcall.run`` and ``from rollcall import run`` import the API lazily
    if name in __all__:
        from rollcall.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'rollcall' has no attribute {name!r}")
