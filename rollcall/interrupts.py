"""SIGINT and SIGTERM, one behaviour for every command: stop, keep what was done, say where.

Ctrl-C and the SIGTERM that Slurm and Kubernetes send both mean "stop now,
but keep the results". The first signal only *asks*: :class:`Stop` records it
and a driver polling ``stop.reason()`` (or watching ``stop.wake_fd()`` in its
selector) ends its run at a consistent point (history flushed,
``summary.json`` written with ``result: interrupted``). A second signal does
not wait: the callbacks registered with :meth:`Stop.on_second` run at once
(they SIGKILL the run's processes by PID) and :class:`Interrupted` is raised
wherever the program is, unless it is inside :meth:`Stop.shielded` (a
process being started and recorded, cleanup, the summary being written),
where it is raised as that section ends. The exit status is the shell's for
a death by that signal (130 for SIGINT, 143 for SIGTERM), so a scheduler
sees what happened.

Before a command has anything to keep (its modules still importing),
:func:`quit_until_main` ends it at once: one line on stderr, that status.

App layer only: the sans-IO core never sees a signal. Both drivers are
handed the :class:`Stop` itself: the sim polls ``reason()`` (all of
:class:`StopRequest`), the real target also watches ``wake_fd()`` and
kills its processes :meth:`Stop.on_second`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator, Optional, Protocol, Union

__all__ = ["Interrupted", "SIGNALS", "Stop", "StopRequest", "catch", "exit_code", "exit_code_of_reason",
           "exit_now", "finish_on_signal", "quit_until_main", "shielded"]

#: the signals that interrupt a command
SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
# what the interpreter sets for each at start, unless it was started with the signal ignored
_DEFAULT_HANDLERS: dict[signal.Signals, Any] = {signal.SIGINT: signal.default_int_handler,
                                                 signal.SIGTERM: signal.SIG_DFL}


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


class StopRequest(Protocol):
    """What a driver that only polls needs of a :class:`Stop`."""

    def reason(self) -> Optional[str]:
        """Why the run must stop (``"interrupted by SIGINT"``), or None."""


class Stop:
    """Which signal asked the program to stop, if one did; what a second one does."""

    def __init__(self, immediate: bool = False) -> None:
        self.signum: Optional[int] = None
        self.immediate = immediate          # the first signal raises too (nothing to keep yet)
        self.count = 0                      # signals received
        #: after a second signal the program has this long to end on its own, then
        #: it exits at once with the signal's status (None: no such bound)
        self.exit_within_s: Optional[float] = None
        self._deadline: Optional[threading.Timer] = None
        self._on_second: list[Callable[[], None]] = []
        self._shield = 0                    # depth of shielded() sections
        self._pending: Optional[int] = None  # a second signal held back by a shield
        self._wake: Optional[tuple[socket.socket, socket.socket]] = None

    def reason(self) -> Optional[str]:
        """``"interrupted by SIGINT"`` once a signal came, else None (what a driver polls)."""
        if self.signum is None:
            return None
        return f"interrupted by {signal.Signals(self.signum).name}"

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.signum is None else exit_code(self.signum)

    def wake_fd(self) -> socket.socket:
        """A socket that becomes readable at every signal (one byte each), for a
        selector loop that must not sleep through the first one."""
        if self._wake is None:
            self._wake = socket.socketpair()
            for end in self._wake:
                end.setblocking(False)
            if self.signum is not None:
                self._poke()
        return self._wake[0]

    def on_second(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the second signal (and each later one), inside the
        handler: it must not block (a SIGKILL by PID, not a wait)."""
        self._on_second.append(callback)

    def forget(self, callback: Callable[[], None]) -> None:
        """No longer run ``callback`` at a second signal (what it would kill
        has ended: a run of a compare that goes on to the next)."""
        self._on_second.remove(callback)

    @contextmanager
    def shielded(self, then_raise: bool = True) -> Iterator[None]:
        """A section that no signal cuts in the middle: a second signal inside it
        still runs the :meth:`on_second` callbacks, but its Interrupted is raised
        only as the section ends (unless an exception already leaves it), or not
        at all with ``then_raise=False`` (the section is the end: cleanup, the
        summary; what the signal would stop has stopped)."""
        self._shield += 1
        try:
            yield
        except BaseException:
            self._shield -= 1
            raise
        self._shield -= 1
        if self._shield == 0 and self._pending is not None:
            signum, self._pending = self._pending, None
            if then_raise:
                raise Interrupted(signum)

    def close(self) -> None:
        """Let go of the wake socket and cancel the exit deadline (the program ended on its own)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._wake is not None:
            for end in self._wake:
                end.close()
            self._wake = None

    def _poke(self) -> None:
        if self._wake is not None:
            try:
                self._wake[1].send(b"!")
            except OSError:  # full: the loop has bytes to read already
                pass

    def handle(self, signum: int) -> None:
        """What a signal does (see the module docstring); raises Interrupted or returns."""
        self.count += 1
        first = self.signum is None
        if first:
            self.signum = signum
        self._poke()
        if first and not self.immediate:
            return
        if not first:
            for callback in self._on_second:
                callback()
            self._arm_deadline()
        if self._shield:
            self._pending = signum
            return
        raise Interrupted(signum)

    def _arm_deadline(self) -> None:
        """The second signal's backstop: whatever the program is stuck in, it
        exits ``exit_within_s`` later (its processes were killed already)."""
        if self.exit_within_s is None or self._deadline is not None:
            return
        code = exit_code(self.signum or signal.SIGINT)

        def give_up() -> None:
            os.write(2, f"interrupted: not ended {self.exit_within_s:g} s after the second "
                        f"signal; exiting now\n".encode())
            os._exit(code)

        self._deadline = threading.Timer(self.exit_within_s, give_up)
        self._deadline.daemon = True
        self._deadline.start()


#: the Stop of the innermost :func:`catch` block in force (signal handlers are per process)
_current: Optional[Stop] = None


@contextmanager
def shielded(then_raise: bool = True) -> Iterator[None]:
    """:meth:`Stop.shielded` of the :func:`catch` block in force, if any: for a
    module that starts a process and must record it before a signal can cut
    in (no Stop needs to be handed down to it)."""
    stop = _current
    if stop is None:
        yield
        return
    with stop.shielded(then_raise):
        yield


@contextmanager
def catch(immediate: Optional[bool] = None, stop: Optional[Stop] = None) -> Iterator[Stop]:
    """Handle SIGINT and SIGTERM inside the block; restore the old handlers after.

    The first signal is recorded in the yielded :class:`Stop` (and, with
    ``immediate``, also raised as :class:`Interrupted`, for work that has no
    clean stopping point of its own but keeps what it finished on a
    KeyboardInterrupt); any later one runs the stop's :meth:`Stop.on_second`
    callbacks and raises :class:`Interrupted` (see :meth:`Stop.shielded`).
    ``stop``: go on with that one (what an enclosing block recorded; its
    ``immediate`` kept unless given). Outside the main thread no handler can be
    set: the block runs with the old behaviour.
    """
    owned = stop is None
    stop = Stop() if stop is None else stop
    if immediate is not None:
        stop.immediate = immediate
    try:
        if threading.current_thread() is not threading.main_thread():
            yield stop
        else:
            with _handlers(stop):
                yield stop
    finally:
        if owned:
            stop.close()


@contextmanager
def _handlers(stop: Stop) -> Iterator[None]:
    """``stop`` handles SIGINT and SIGTERM inside the block (main thread only)."""
    global _current

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        stop.handle(signum)

    old = {s: signal.getsignal(s) for s in SIGNALS}
    outer = _current
    for s in SIGNALS:
        signal.signal(s, on_signal)
    _current = stop
    try:
        yield
    finally:
        _current = outer
        for s, handler in old.items():
            signal.signal(s, handler)


def quit_until_main(program: str) -> None:
    """While the ``program`` command is still importing its modules, a signal
    ends it at once: one line on stderr and the signal's exit status (nothing
    was started or written yet). Only in that command's own process (its
    console script, or ``python -m`` of its package), in the main thread, and
    for each signal only over the interpreter's default handler: importing
    the module from elsewhere (a test, ``rollcall.app.api``, a host agent)
    changes nothing, and a signal the command was started with ignored (a
    shell's background job ignores SIGINT) stays ignored, the other one
    still handled."""
    if not _program_is(program):
        return

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        os.write(2, f"{program}: interrupted by {signal.Signals(signum).name}\n".encode())
        os._exit(exit_code(signum))

    for s in SIGNALS:
        if signal.getsignal(s) is _DEFAULT_HANDLERS[s]:
            signal.signal(s, on_signal)


def finish_on_signal(program: str, code: int) -> None:
    """The ``program`` command has decided and printed its result, ``code``; a
    signal from here to the process's end ends it at once with that status
    (the result stands). Only in that command's own process, as
    :func:`quit_until_main`; stdout must be flushed already."""
    if not _program_is(program):
        return

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        os._exit(code)

    for s in SIGNALS:
        signal.signal(s, on_signal)


def exit_now(program: str, code: int) -> None:
    """End the ``program`` command's own process here with ``code``, its result
    decided and said: no interpreter teardown, in which the handlers are
    reset to the default and a signal would end it with the signal's status
    instead (torch's teardown takes a while). Elsewhere (a test calling
    ``main``) it returns."""
    if not _program_is(program):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _program_is(program: str) -> bool:
    """Whether this process is the ``program`` command (its console script, or
    ``python -m program``) and this is its main thread."""
    entry = Path(sys.argv[0] if sys.argv else "")
    ours = entry.name == program or (entry.name == "__main__.py" and entry.parent.name == program)
    return ours and threading.current_thread() is threading.main_thread()
