"""Ahead-of-time compilation of (problem, config) pairs on every CPU core.

Compiling is CPU work (median 0.4 s a config on the H200's host) and timing is GPU work, so
they run in separate processes: compile workers fill Triton's on-disk cache, which the timing
process then loads from in about a millisecond per kernel. A kernel compiled for one shape
serves every shape with the same specialisation (dtype, epilogue, sizes and strides divisible
by 16 or not). `compile_stream` yields results in the order of its jobs while the workers run
ahead, so a caller can time problem i while problem i+1 compiles.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from graphs import GemmProblem
from gnn_policy.interrupts import children_ignore_sigint, quiet_child
from gnn_policy.space import TileConfig


@dataclasses.dataclass(frozen=True)
class CompileResult:
    problem: str
    config: str
    status: str  # ok | invalid (the variant cannot serve this layout) | compile_error | timeout | oom
    seconds: float
    error: str = ""
    kernel: str = ""  # Triton's cache key of the compiled specialisation (one per distinct kernel)


class CompileTimeout(Exception):
    pass


_EXPIRED: list[bool] = [False]  # set by the alarm: Triton may re-raise CompileTimeout as its own error


def _alarm(signum: int, frame: object) -> None:
    _EXPIRED[0] = True
    raise CompileTimeout


_INPUTS: dict[str, dict] = {}  # per compile process: the current problem's unfilled tensors


def stand_in(problem: GemmProblem) -> GemmProblem:
    """A small problem whose kernels are the ones `problem` needs, compiled in its place.

    Triton specialises an integer argument on its divisibility by 16 (and on being 1), and the
    launch on K's remainder modulo BLOCK_K (the K-tail masks) and on the layouts; sizes
    otherwise only set the grid, which compiling does not see (nor does it check the validity
    rules). So M, N and K keep their remainder modulo 256 and the batch its remainder modulo 16:
    products of sizes (the strides) keep theirs. Every compile worker holds its problem's inputs, and 15 of them once
    held 4 GB each of the H100's 80 GB and ran the timing process out of memory.
    """
    def shrink(x: int, period: int) -> int:
        return x if x < 2 * period else period + x % period

    return dataclasses.replace(problem, m=shrink(problem.m, 256), n=shrink(problem.n, 256),
                               k=shrink(problem.k, 256), batch=shrink(problem.batch, 16))


def _inputs(problem: GemmProblem) -> dict:
    if problem.key not in _INPUTS:
        import torch

        from gnn_policy.measure.inputs import make_inputs

        _INPUTS.clear()  # jobs arrive grouped by problem: keep one problem's tensors alive
        torch.cuda.empty_cache()  # and give the last one's memory back to the timing process
        _INPUTS[problem.key] = make_inputs(stand_in(problem), "cuda", fill=False)
    return _INPUTS[problem.key]


def compile_one(job: tuple[GemmProblem, TileConfig, float]) -> CompileResult:
    """Compile one pair into Triton's cache; a compile past `timeout_s` becomes a `timeout` result.

    The alarm interrupts Python code and the ptxas subprocess Triton waits on; time spent
    inside one call into LLVM is interrupted when that call returns.
    """
    from gnn_policy.kernels.launch import LayoutError, compile_kernel

    problem, config, timeout_s = job
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    _EXPIRED[0] = False
    kernel = ""
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            args = _inputs(problem)
            compiled = compile_kernel(args["a"], args["b"], config, bias=args["bias"],
                                      activation=args["activation"], residual=args["residual"])
            kernel = getattr(compiled, "hash", "") or ""
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # disarmed before any handler below runs
        status, error = "ok", ""
    except LayoutError as exc:
        status, error = "invalid", str(exc)
    except Exception as exc:  # a compiler failure is a result, not a crash of the pool
        status, error = "compile_error", f"{type(exc).__name__}: {exc}"[:500]
        if _EXPIRED[0]:
            status, error = "timeout", f"compile took longer than {timeout_s:g} s"
        elif "OutOfMemoryError" in type(exc).__name__:  # this process's inputs: not the config's fault
            status = "oom"
    finally:
        signal.signal(signal.SIGALRM, previous)
    return CompileResult(problem.key, config.key, status, time.perf_counter() - start, error, kernel)


def default_workers() -> int:
    """Every core but one, which the timing process needs; under torchrun, of this rank's share
    of the host's cores."""
    from gnn_policy.distributed import launch

    return max(1, min(32, (os.cpu_count() or 2) // launch().local_world - 1))


def _numbered(job: tuple[int, Any, tuple, Any]) -> tuple[int, CompileResult]:
    index, fn, args, started = job
    started[index] = os.getpid()  # so the parent can tell a job whose process died
    return index, fn(args)


class CompilePool:
    """Compile worker processes kept alive across batches (a search measures in many small ones).

    A compiler that aborts (a failed C++ assertion in Triton kills its process; seen on the
    H200 for warp-specialised 64x256 tiles) loses its job without a word: the pool starts a
    new worker. Each job records which process took it, so a job whose process is gone is
    recorded as a `compile_error` at once; a job past twice the compile alarm plus `grace_s`
    is recorded so too, whatever the reason.
    """

    def __init__(self, workers: int | None = None, timeout_s: float = 120.0,
                 fn: Callable[[tuple], CompileResult] | None = None, grace_s: float = 30.0):
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.fn = fn or compile_one
        context = multiprocessing.get_context("spawn")  # CUDA cannot fork
        with children_ignore_sigint():  # Ctrl-C is the parent's: a worker would only print a traceback
            self._pool = context.Pool(workers or default_workers(), initializer=quiet_child,
                                      initargs=(os.getpid(),))
            self._manager = context.Manager()
        self._started = self._manager.dict()

    def _lost(self, index: int) -> bool:
        pid = self._started.get(index)
        return pid is not None and pid not in {w.pid for w in self._pool._pool}

    def stream(self, jobs: Iterable[tuple[GemmProblem, TileConfig]]) -> Iterator[CompileResult]:
        """One CompileResult per job, in job order, while the workers run ahead."""
        jobs = list(jobs)
        self._started.clear()
        results = self._pool.imap_unordered(
            _numbered, ((i, self.fn, (p, c, self.timeout_s), self._started) for i, (p, c) in enumerate(jobs)))
        done: dict[int, CompileResult] = {}
        for i, (problem, config) in enumerate(jobs):
            overdue = time.monotonic() + 2 * self.timeout_s + self.grace_s
            while i not in done and time.monotonic() < overdue and not self._lost(i):
                try:
                    index, result = results.next(timeout=1.0)
                    done[index] = result
                except multiprocessing.TimeoutError:
                    continue
            yield done.pop(i, None) or CompileResult(problem.key, config.key, "compile_error", 0.0,
                                                     "the compiler process died (an abort inside Triton)")

    def close(self) -> None:
        self._pool.terminate()  # compiles in flight are abandoned
        self._pool.join()
        self._manager.shutdown()

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compile_stream(jobs: Iterable[tuple[GemmProblem, TileConfig]], *, workers: int | None = None,
                   timeout_s: float = 120.0) -> Iterator[CompileResult]:
    """One CompileResult per job, in job order, compiled ahead by a pool of processes.

    Closing the generator early terminates the workers (and the compiles in flight).
    """
    with CompilePool(workers, timeout_s) as pool:
        yield from pool.stream(jobs)


def precompile(jobs: Iterable[tuple[GemmProblem, Sequence[TileConfig]]], *, workers: int | None = None,
               timeout_s: float = 120.0, progress: bool = True) -> list[CompileResult]:
    """Compile every (problem, config) pair into Triton's cache before anything is timed."""
    from tqdm import tqdm

    pairs = [(p, c) for p, cs in jobs for c in cs]
    stream = compile_stream(pairs, workers=workers, timeout_s=timeout_s)
    return list(tqdm(stream, total=len(pairs), desc="compile", unit="cfg", disable=not progress))
