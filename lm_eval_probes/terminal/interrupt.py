"""Ctrl-C as an answer: the plugin's commands end an interrupted run with one line and exit status 130.

* :func:`deferred_interrupt` — a block that a Ctrl-C does not cut in two (a status file is written whole): the
  interrupt is raised when the block ends;
* :func:`stop_at_next_interrupt` — after the first Ctrl-C, while the command writes what it has and exits, a second
  one stops the process at once (the default ``SIGINT`` action, no Python code runs).

Both act only in the main thread (the only one that receives signals); elsewhere they change nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

EXIT_INTERRUPTED = 130
"""The exit status of a command ended by Ctrl-C (128 + SIGINT), as a shell reports it."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Inside the block a Ctrl-C is remembered, not raised; it is raised as :class:`KeyboardInterrupt` when the block
    ends (after the previous handler is back)."""
    if not _main_thread():
        yield
        return
    caught: list[int] = []

    def remember(signum: int, frame: Any) -> None:
        caught.append(signum)

    previous = signal.signal(signal.SIGINT, remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def stop_at_next_interrupt() -> Any:
    """From now on a Ctrl-C ends the process at once (``SIG_DFL``); returns the handler it replaced (``None``
    outside the main thread), for :func:`restore_interrupt`."""
    if not _main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_DFL)


def restore_interrupt(previous: Any) -> None:
    """Put back the handler :func:`stop_at_next_interrupt` replaced (nothing for ``None``)."""
    if previous is not None and _main_thread():
        signal.signal(signal.SIGINT, previous)
