"""Command-line pieces shared by the ``rollcall`` command and the drivers' own entry points.

Why a module of its own: ``python -m real.host`` (the host agent the real
launcher starts) takes the arguments ``rollcall host`` takes and must refuse
bad input the same way, yet a driver imports no part of the CLI. This module
needs only the standard library, so a driver may import it
(``tests/test_purity.py``, ``DRIVER_MAY_IMPORT``).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["OneLineParser", "parse_keeper"]


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (the house rule for bad input), still exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


def parse_keeper(text: str) -> tuple[str, int]:
    """``ADDR:PORT``: an IPv4 address or a host name, and a port 1..65535."""
    addr, sep, port = text.rpartition(":")
    if not sep or not addr or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {text!r}")
    return addr, int(port)
