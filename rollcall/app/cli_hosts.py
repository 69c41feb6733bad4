"""``rollcall keeper`` and ``rollcall host``: the real target across machines.

``rollcall run`` of a scenario with ``cluster.workers_per_host`` is these two
pieces in one command: the keeper service in-process and one host agent per
network namespace. Across real machines the same programs run apart:

- ``rollcall keeper SCENARIO --bind ADDR[:PORT] --out DIR``: the keeper
  service, the fault plan and the history, listening on ``ADDR`` (an address
  of this machine every host reaches); it starts no host. It prints the
  address and the path of the run's token file (``DIR/real/secret``, 0600)
  and writes both to ``DIR/real/keeper.json``, then waits for the hosts.
- ``rollcall host --keeper ADDR:PORT --token-file F --host H``: the host
  agent of host ``H`` (it starts and reaps that host's workers on order and
  reports their exits). The token is read from the file, never taken on a
  command line.

Like the rest of the CLI, this reaches the real target only when a command
runs, through :mod:`rollcall.app.targets`. ``rollcall keeper`` is a run as
``rollcall run`` makes it, so its command is :mod:`rollcall.app.cli`'s
(``_cmd_keeper``, handed to :func:`add_commands`) and only its own checks
(:func:`keeper_problem`) are here: the CLI imports this module, never the
other way round.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
from typing import TYPE_CHECKING, Any, Callable

from rollcall.app import targets
from rollcall.cli_args import parse_keeper

__all__ = ["NETWORK_FAULTS", "add_commands", "keeper_problem", "parse_bind", "parse_keeper"]

if TYPE_CHECKING:
    from rollcall.scenario import Scenario

# faults on a host's link: the launcher carries them out in the namespaces it built
# the faults that need the run's own namespaces (nftables rules in them); a
# ``delay`` is the host agents' (their relay of the keeper link), so it runs
# on external hosts too
NETWORK_FAULTS = ("partition", "isolate_keeper", "loss")


def parse_bind(text: str) -> tuple[str, int]:
    """``ADDR`` or ``ADDR:PORT``: an IPv4 address of this machine, a port 0..65535 (0: any)."""
    addr, sep, port = text.partition(":")
    try:
        ipaddress.IPv4Address(addr)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IPv4 address [:PORT], got {text!r}") from None
    if sep and not (port.isdigit() and int(port) < 65536):
        raise argparse.ArgumentTypeError(f"expected a port 0..65535 after the address, got {text!r}")
    return addr, int(port) if sep else 0


def _host_index(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a host number >= 0, got {text!r}")
    return int(text)


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None],
                 keeper: Callable[[argparse.Namespace], int]) -> None:
    """Add the ``keeper`` command (run by ``keeper``) and ``host`` to the CLI's subcommands."""
    p = sub.add_parser("keeper", help="the real target's keeper service for hosts that run "
                                      "`rollcall host` (the run's history and faults; no hosts)")
    common(p)
    p.add_argument("--bind", type=parse_bind, required=True, metavar="ADDR[:PORT]",
                   help="listen here: an address of this machine every host reaches")
    p.add_argument("--out", required=True, metavar="DIR", help="run directory (history, token file)")
    p.add_argument("--seed", type=int, help="override the scenario's seed")
    p.add_argument("--strategy", choices=("elastic", "checkpoint-restart"), help="override strategy.kind")
    p.add_argument("--force", action="store_true", help="reuse a non-empty --out")
    p.add_argument("--max-wall-s", type=float, metavar="S", help="end the run after S seconds")
    p.set_defaults(func=keeper, target="real")

    p = sub.add_parser("host", help="a host agent: starts and reaps one host's workers for "
                                    "`rollcall keeper`")
    p.add_argument("--keeper", type=parse_keeper, required=True, metavar="ADDR:PORT")
    p.add_argument("--token-file", required=True, metavar="F",
                   help="the run's token file (0600; what `rollcall keeper` printed)")
    p.add_argument("--host", type=_host_index, required=True, metavar="H")
    p.set_defaults(func=_cmd_host)


def keeper_problem(scenario: Scenario, bind: tuple[str, int],
                   max_wall_s: float | None) -> str | None:
    """Why ``rollcall keeper`` cannot run ``scenario`` here as asked (one line), or None."""
    if scenario.cluster.workers_per_host is None:
        return f"{scenario.name}: rollcall keeper needs hosts: set cluster.workers_per_host"
    cuts = [f.action for f in scenario.failures.schedule if f.action in NETWORK_FAULTS]
    if cuts:
        return (f"{scenario.name}: rollcall keeper cannot {cuts[0]} hosts it does not run "
                f"(their links are not its own); use rollcall run")
    if max_wall_s is not None and not max_wall_s > 0:
        return f"--max-wall-s: must be > 0, got {max_wall_s}"
    return _bind_problem(bind)


def _bind_problem(bind: tuple[str, int]) -> str | None:
    """Whether this machine can listen at ``bind`` (one line), tried now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(bind)
        except OSError as exc:
            return f"--bind {bind[0]}:{bind[1]}: cannot listen there: {exc.strerror or exc}"
    return None


def _cmd_host(args: argparse.Namespace) -> int:
    return targets.serve_host(args.keeper, args.token_file, args.host)
