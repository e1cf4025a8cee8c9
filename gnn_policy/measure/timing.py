"""One timing method for every GEMM this project reports: CUDA-graph replays timed by events.

Measured on the H200: `triton.testing.do_bench` read 8-48% lower than graph replay, so every
figure here (ours, cuBLAS, baselines) goes through `time_graph`. Inputs are rotated: the
graph calls the kernel once per input set, with enough sets that together they exceed the L2
twice over, so a small problem is timed from HBM as it would run inside a model, not from L2.

Precision is spent where it decides something: a config whose first timed replay is already
over `SCREEN` times the best config measured so far on the same problem keeps that one replay
as its time. Within a run a replay's spread is under 1%, far inside a factor of two, and
such configs were about half of the GPU time of a full-precision collection.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Callable

import torch


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call time of one (problem, implementation): median and spread over graph replays."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    replays: int
    calls_per_replay: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative noise of this measurement."""
        return (self.p90_ms - self.p10_ms) / self.median_ms

    def tflops(self, flops: float) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12


def rotation_count(bytes_per_call: int, l2_bytes: int, cap: int = 64) -> int:
    """Input sets needed so that one replay streams at least twice the L2 from memory."""
    return max(1, min(cap, -(-2 * l2_bytes // max(1, bytes_per_call))))


SCREEN = 2.0  # a config slower than this many times the best so far is timed from one replay


def time_graph(fn: Callable[[int], object], calls: int, *, replays: int = 20,
               warmup: int = 1, stream: torch.cuda.Stream | None = None,
               budget_ms: float = 50.0, min_replays: int = 3,
               screen_ms: float | None = None) -> Timing:
    """Time `fn(i)` for i in range(calls), captured once as a CUDA graph and replayed.

    `fn(i)` must use the i-th input set. `warmup` eager calls first load the kernel and make
    what it allocates lazily (cuBLAS workspaces, split-K tile counters), which must not be
    first made inside the capture; one call does that, where a pass over every set launched
    as often as the capture itself (64 times for a small problem). The graph is captured on
    `stream` (a side stream by default, as capture requires). The replays timed are as many
    as fit in `budget_ms` of GPU time, between `min_replays` and `replays`: a config 100x
    slower than the best costs 3 replays, not 20. When the probe replay already exceeds
    `screen_ms` per call, it is the only one timed. `warmup=0` is for a kernel that has
    already run eagerly (its correctness check loaded it).
    """
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the inputs were made on the current stream
    with torch.cuda.stream(stream):
        for i in range(warmup):
            fn(i % calls)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    probe = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    with torch.cuda.stream(stream):
        graph.replay()  # first replay uploads the graph
        probe[0].record(stream)
        graph.replay()
        probe[1].record(stream)
    probe[1].synchronize()
    first_ms = probe[0].elapsed_time(probe[1])
    if screen_ms is not None and first_ms / calls > screen_ms:
        del graph
        return Timing(first_ms / calls, first_ms / calls, first_ms / calls, 1, calls)
    replays = min(replays, max(min_replays, int(budget_ms / max(first_ms, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    with torch.cuda.stream(stream):
        for s, e in zip(starts, ends):
            s.record(stream)
            graph.replay()
            e.record(stream)
    stream.synchronize()
    per_call = sorted(s.elapsed_time(e) / calls for s, e in zip(starts, ends))
    q = statistics.quantiles(per_call, n=10) if len(per_call) > 1 else per_call * 9
    del graph
    return Timing(statistics.median(per_call), q[0], q[-1], replays, calls)
