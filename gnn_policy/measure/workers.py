"""Measurements in a worker process that is restarted after a crash or a timeout.

A kernel that faults poisons its CUDA context, and one that hangs holds the GPU, so the
measuring runs in a child process. The parent hands it one problem and its configs, reads one
Measurement per config as it is made, and when the child dies or goes silent for longer than
`timeout_s`, records the config in flight as `crashed` or `timeout`, starts a fresh child and
goes on with the configs after it. Nothing already reported is lost. A failure before the
first config (the problem's inputs do not fit, say) raises `ProblemSetupError` instead.

The measuring function is named by a dotted path ("package.module:function") so the child can
import it: a generator `fn(problem, configs, **options)` that yields one Measurement per config,
in order.
"""
from __future__ import annotations

import argparse
import importlib
import multiprocessing
import multiprocessing.connection
import os
from typing import Any, Iterator, Sequence

from graphs import GemmProblem
from gnn_policy.interrupts import children_ignore_sigint, quiet_child
from gnn_policy.measure.result import CUBLAS, Measurement
from gnn_policy.space import TileConfig


def runner_path(text: str) -> str:
    """--runner's check: "package.module:function", as the worker imports it."""
    module, _, name = text.partition(":")
    if not (name.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        raise argparse.ArgumentTypeError(f"{text!r} is not package.module:function")
    return text


def _child(conn: multiprocessing.connection.Connection, fn_path: str, options: dict[str, Any],
           parent_pid: int | None = None) -> None:
    quiet_child(parent_pid)
    try:
        try:
            module, name = fn_path.split(":")
            fn = getattr(importlib.import_module(module), name)
        except Exception as exc:  # noqa: BLE001 - the parent reports it in one line
            conn.send(StartFailed(f"{type(exc).__name__}: {exc}"[:500]))
            return
        _serve(conn, fn, options)
    except (EOFError, OSError):  # the parent is gone (killed, or closed the pipe): nothing to report to
        return


def _serve(conn: multiprocessing.connection.Connection, fn: Any, options: dict[str, Any]) -> None:
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        problem, configs = job
        produced = False
        try:
            for measurement in fn(problem, configs, **options):
                produced = True
                conn.send(measurement)
                if measurement.status == "crashed":
                    return  # the CUDA context may be poisoned: the pool starts a fresh process
        except Exception as exc:
            if produced:  # a closed pipe among them: `_child` ends quietly on it
                raise
            # Before the first config: the problem's inputs or reference failed (e.g. out of
            # memory). No config is to blame, so no config gets a row.
            conn.send(SetupFailed(f"{type(exc).__name__}: {exc}"[:500]))
            return


class StartFailed(str):
    """The child's message when the measuring function cannot be imported (the reason)."""


class WorkerError(RuntimeError):
    """The measuring worker could not start: the message says why."""


class SetupFailed(str):
    """The child's message when a problem could not be set up (the reason)."""


class ProblemSetupError(RuntimeError):
    """The measuring function failed before its first config: a problem fault, not a config's."""


class WorkerPool:
    """One measuring child process (one GPU); `run` survives the child's death."""

    def __init__(self, fn_path: str, *, gpu: str, timeout_s: float = 120.0,
                 startup_timeout_s: float = 300.0, **options: Any):
        self.fn_path, self.gpu, self.timeout_s = fn_path, gpu, timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.options = dict(options, gpu=gpu)
        self.ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        self.restarts = 0
        self._proc = self._conn = None

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self._proc = self.ctx.Process(target=_child, args=(child, self.fn_path, self.options, os.getpid()),
                                      daemon=True)
        with children_ignore_sigint():
            self._proc.start()
        child.close()
        self._conn = parent
        # Imports (torch, CUDA) happen before the first config and do not count against it.
        if not parent.poll(self.startup_timeout_s):
            self._kill()
            raise WorkerError(f"measuring worker {self.fn_path} did not start within {self.startup_timeout_s:g} s")
        try:
            msg = parent.recv()
        except EOFError:
            self._proc.join(timeout=10)  # reap it, so that its exit code is known
            msg = StartFailed(f"it exited (code {self._proc.exitcode}) before it was ready")
        if msg != "ready":
            self._kill()
            raise WorkerError(f"measuring worker {self.fn_path} could not start: {msg}")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
                self._proc.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        if kind is not None:  # stopped by an error or Ctrl-C: the job in flight is abandoned at once
            self._kill()
        self.close()

    def _failed(self, problem: GemmProblem, config: TileConfig | None, status: str, why: str) -> Measurement:
        self._kill()
        self.restarts += 1
        return Measurement(self.gpu, problem.key, config.key if config else CUBLAS, status, error=why)

    def run(self, problem: GemmProblem, configs: Sequence[TileConfig | None]) -> Iterator[Measurement]:
        """One Measurement per config (None: cuBLAS), in order, whatever happens to the child."""
        finished = False
        try:
            yield from self._run(problem, configs)
            finished = True
        finally:
            if not finished:  # a caller that stopped early leaves the child mid-problem
                self._kill()

    def _run(self, problem: GemmProblem, configs: Sequence[TileConfig | None]) -> Iterator[Measurement]:
        todo = list(configs)
        while todo:
            if self._proc is None:
                self._start()
            self._conn.send((problem, todo))
            done = 0
            while done < len(todo):
                config = todo[done]
                if not self._conn.poll(self.timeout_s):
                    yield self._failed(problem, config, "timeout", f"no result within {self.timeout_s:g} s")
                    done += 1
                    break
                try:
                    msg = self._conn.recv()
                except EOFError:
                    self._proc.join(timeout=10)  # reap it, so that its exit code is known
                    yield self._failed(problem, config, "crashed", f"worker exited (code {self._proc.exitcode})")
                    done += 1
                    break
                if isinstance(msg, SetupFailed):
                    self._kill()
                    self.restarts += 1
                    raise ProblemSetupError(f"{problem.key}: {msg}")
                yield msg
                done += 1
                if msg.status == "crashed":  # the child reported it and exits
                    self._kill()
                    self.restarts += 1
                    break
            else:
                return
            todo = todo[done:]
