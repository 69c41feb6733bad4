"""SIGINT and SIGTERM, one behaviour for every command: stop, keep what was done, say where.

Ctrl-C and the SIGTERM that Slurm and Kubernetes send both mean "stop now,
but keep the results". The first signal only *asks*: :class:`Stop` records it
and a driver polling ``stop.reason()`` ends its run at a consistent point
(history flushed, ``summary.json`` written with ``result: interrupted``). A
second signal does not wait: it raises :class:`Interrupted` wherever the
program is. The exit status is the shell's for a death by that signal
(130 for SIGINT, 143 for SIGTERM), so a scheduler sees what happened.

App layer only: the sans-IO core never sees a signal; a driver sees a
callable that returns a reason string or None.
"""

from __future__ import annotations

import re
import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator, Optional, Union

__all__ = ["Interrupted", "SIGNALS", "Stop", "catch", "exit_code", "exit_code_of_reason"]

#: the signals that interrupt a command
SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The shell's status for a process ended by ``signum`` (130 for SIGINT, 143 for SIGTERM)."""
    assert signum in SIGNALS, signum
    return 128 + int(signum)


def exit_code_of_reason(reason: str) -> int:
    """The exit status for a run whose summary reason names the signal ("interrupted by
    SIGTERM", as the real launcher writes it); SIGINT's when it names none."""
    m = re.search(r"\bSIG(INT|TERM)\b", reason or "")
    return exit_code(signal.Signals["SIG" + m.group(1)] if m else signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A signal that does not wait for a clean stop (the second one, or any in an
    ``immediate`` section); a KeyboardInterrupt, so code that keeps its finished
    work on Ctrl-C keeps it on SIGTERM too."""

    def __init__(self, signum: Union[int, str]) -> None:
        # by name too: simpy re-raises a callback's exception as type(exc)(*exc.args)
        sig = signal.Signals[signum] if isinstance(signum, str) else signal.Signals(signum)
        super().__init__(sig.name)
        self.signum = int(sig)

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


class Stop:
    """Which signal asked the program to stop, if one did."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None

    def reason(self) -> Optional[str]:
        """``"interrupted by SIGINT"`` once a signal came, else None (what a driver polls)."""
        if self.signum is None:
            return None
        return f"interrupted by {signal.Signals(self.signum).name}"

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.signum is None else exit_code(self.signum)


@contextmanager
def catch(immediate: bool = False) -> Iterator[Stop]:
    """Handle SIGINT and SIGTERM inside the block; restore the old handlers after.

    The first signal is recorded in the yielded :class:`Stop` (and, with
    ``immediate``, also raised as :class:`Interrupted`, for work that has no
    clean stopping point of its own but keeps what it finished on a
    KeyboardInterrupt); any later one raises :class:`Interrupted`. Outside the
    main thread no handler can be set: the block runs with the old behaviour.
    """
    stop = Stop()

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        first = stop.signum is None
        if first:
            stop.signum = signum
        if immediate or not first:
            raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, on_signal)
    try:
        yield stop
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
