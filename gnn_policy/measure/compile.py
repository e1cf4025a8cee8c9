"""Ahead-of-time compilation of (problem, config) pairs on every CPU core.

Compiling is CPU work (median 0.4 s a config on the H200's host) and timing is GPU work, so
they run in separate steps: worker processes fill Triton's on-disk cache, which the timing
process then loads from in about a millisecond per kernel. A kernel compiled for one shape
serves every shape with the same specialisation (sizes and strides divisible by 16 or not).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
import time
from typing import Iterable, Sequence

from graphs import GemmProblem
from gnn_policy.space import TileConfig


@dataclasses.dataclass(frozen=True)
class CompileResult:
    problem: str
    config: str
    status: str  # ok | invalid (the variant cannot serve this layout) | compile_error
    seconds: float
    error: str = ""


def _compile_chunk(problem: GemmProblem, configs: Sequence[TileConfig]) -> list[CompileResult]:
    from gnn_policy.kernels.launch import LayoutError, compile_kernel
    from gnn_policy.measure.inputs import make_inputs

    args = make_inputs(problem, "cuda", fill=False)
    out = []
    for config in configs:
        start = time.perf_counter()
        try:
            compile_kernel(args["a"], args["b"], config, bias=args["bias"],
                           activation=args["activation"], residual=args["residual"])
            status, error = "ok", ""
        except LayoutError as exc:
            status, error = "invalid", str(exc)
        except Exception as exc:  # a compiler failure is a result, not a crash of the pool
            status, error = "compile_error", f"{type(exc).__name__}: {exc}"[:500]
        out.append(CompileResult(problem.key, config.key, status, time.perf_counter() - start, error))
    return out


def precompile(jobs: Iterable[tuple[GemmProblem, Sequence[TileConfig]]], *, workers: int | None = None,
               chunk: int = 4, progress: bool = True) -> list[CompileResult]:
    """Compile every (problem, config) pair into Triton's cache, in parallel worker processes."""
    from tqdm import tqdm

    tasks = [(p, list(cs[i:i + chunk])) for p, cs in jobs for i in range(0, len(cs), chunk)]
    workers = workers or min(16, os.cpu_count() or 1)
    results: list[CompileResult] = []
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool, \
            tqdm(total=sum(len(cs) for _, cs in tasks), desc="compile", unit="cfg",
                 disable=not progress) as bar:
        futures = [pool.submit(_compile_chunk, p, cs) for p, cs in tasks]
        for fut in cf.as_completed(futures):
            chunk_results = fut.result()
            results.extend(chunk_results)
            bar.update(len(chunk_results))
    return results
