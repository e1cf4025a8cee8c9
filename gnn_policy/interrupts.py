"""Ctrl-C and `kill`: the parent process owns shutdown, its workers die quietly with it.

A command that measures stores as it goes, so stopping it loses at most the work in flight.
What the user needs then is one line: what was stored and how to go on. `on_interrupt` turns
a KeyboardInterrupt inside a command into `Interrupted(that line)`; `main` prints it and exits
with 130, the shell's code for a run stopped by SIGINT. SIGTERM (a plain `kill`) takes the
same path (`terminate_as_interrupt`).

Worker processes (measuring, compiling) must not answer Ctrl-C themselves: the terminal
sends SIGINT to the whole process group, and a worker that raised KeyboardInterrupt would
print its own traceback while the parent is already cleaning up. So they are started with
SIGINT blocked (`children_ignore_sigint`: the mask is inherited from their first instruction,
before Python in them could install a handler) and ignore it (`quiet_child`). On Linux they
also ask the kernel to kill them when their parent dies, so a `kill -9` of the parent leaves
no worker behind.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a run stopped by Ctrl-C


class Interrupted(Exception):
    """A command stopped by Ctrl-C or SIGTERM; the message says what it stored and how to resume."""


@contextlib.contextmanager
def on_interrupt(describe: Callable[[], str]) -> Iterator[None]:
    """Turn a KeyboardInterrupt in the block into `Interrupted(describe())`."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(describe()) from None


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """In the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started in the block begin with SIGINT blocked; a Ctrl-C that arrives meanwhile
    is delivered to this process when the block ends, not lost."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def quiet_child(parent_pid: int | None = None) -> None:
    """First thing in a worker process: leave Ctrl-C to the parent, and die with the parent.

    A watcher thread ends the worker once its parent process is gone. prctl's PDEATHSIG is not
    used: it fires when the parent *thread* ends, and multiprocessing.Pool starts replacement
    workers (after a compiler abort) from a helper thread that ends at `terminate()`; a worker
    killed then while holding the task queue's lock deadlocks the pool's shutdown.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = parent_pid if parent_pid is not None else os.getppid()
    if os.getppid() != parent:  # the parent died before this worker started
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="quiet-child-watch").start()
