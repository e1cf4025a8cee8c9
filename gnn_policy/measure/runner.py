"""Check a config against torch, then time it; the same for cuBLAS.

Correct first: a config's output is compared with a float64 reference on fresh random inputs,
into an output poisoned with NaN, so an unwritten element can never pass. Only then is it
timed, with the one method of `timing.time_graph` on rotated input sets.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import time
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from graphs import GemmProblem
from gnn_policy.kernels.launch import launch
from gnn_policy.kernels.reference import TOLERANCE, reference, relative_error
import hardware_specs
from gnn_policy.measure.clocks import sm_clock_mhz
from gnn_policy.measure.inputs import make_inputs
from gnn_policy.measure.result import CUBLAS, Measurement
from gnn_policy.measure.timing import SCREEN, Timing, rotation_count, time_graph
from gnn_policy.space import TileConfig


@dataclasses.dataclass(frozen=True)
class Checked:
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


class Bench:
    """Inputs, reference and rotated input sets of one problem on the local GPU."""

    def __init__(self, problem: GemmProblem, l2_bytes: int, seed: int = 0,
                 stream: torch.cuda.Stream | None = None):
        self.problem = problem
        self.stream = stream  # an SM slice's stream, or None for the whole GPU
        self.check_args = make_inputs(problem, "cuda", seed=seed)
        self.ref = reference(**self.check_args)
        calls = rotation_count(problem.bytes_min(), l2_bytes)
        self.sets = [make_inputs(problem, "cuda", seed=seed + 1 + i) for i in range(calls)]
        self.out_shape = tuple(self.ref.shape)
        self.checked: set[TileConfig] = set()  # their kernels are loaded: no warm-up before capture

    def check(self, config: TileConfig) -> Checked:
        args = self.check_args
        out = torch.full(self.out_shape, float("nan"), dtype=args["a"].dtype, device="cuda")
        stream = self.stream or torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())  # inputs and poison are on the current stream
        with torch.cuda.stream(stream):
            launch(args["a"], args["b"], config, bias=args["bias"], activation=args["activation"],
                   residual=args["residual"], out=out)
        torch.cuda.synchronize()
        self.checked.add(config)
        err = relative_error(out, self.ref)
        return Checked(err, TOLERANCE[args["a"].dtype])

    def time(self, config: TileConfig, replays: int = 20, screen_ms: float | None = None) -> Timing:
        """Time a config; one that `check` ran is already loaded and, without split-K, gets no warm-up call."""
        outs = [torch.empty(self.out_shape, dtype=s["a"].dtype, device="cuda") for s in self.sets]

        def run(i: int) -> None:
            s = self.sets[i]
            launch(s["a"], s["b"], config, bias=s["bias"], activation=s["activation"],
                   residual=s["residual"], out=outs[i])

        # A split-K config's tile counters may be first made inside the capture, where their
        # zero-fill would join every timed replay: one eager call makes them outside it.
        warmup = 0 if config in self.checked and config.split_k == 1 else 1
        return time_graph(run, len(self.sets), replays=replays, warmup=warmup, stream=self.stream,
                          screen_ms=screen_ms)

    def time_cublas(self, replays: int = 20) -> Timing:
        """torch.matmul, plus the epilogue as separate torch ops (what a model would run)."""
        def run(i: int) -> None:
            s = self.sets[i]
            out = torch.matmul(s["a"], s["b"])
            if s["bias"] is not None:
                out = out + s["bias"]
            if s["activation"] is not None:
                out = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[s["activation"]](out)
            if s["residual"] is not None:
                out = out + s["residual"]

        return time_graph(run, len(self.sets), replays=replays, stream=self.stream)


@functools.lru_cache(maxsize=1)
def environment() -> str:
    """The software that produced a real row: its `versions` field."""
    import triton

    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip().splitlines()
    return (f"torch {torch.__version__}; triton {triton.__version__}; cuda {torch.version.cuda}; "
            f"driver {driver[0] if driver else '?'}")


def _status_of(exc: Exception) -> str:
    name = type(exc).__name__
    if name in ("OutOfResources", "OutOfMemoryError"):  # e.g. a split-K workspace past the free memory
        return "out_of_resources"
    if name in ("CompilationError", "CompileTimeAssertionFailure"):
        return "compile_error"
    return "crashed"


def measure_configs(problem, configs: Sequence[TileConfig | None], *, gpu: str, replays: int = 10,
                    seed: int = 0) -> Iterator[Measurement]:
    """Check then time each config (None: cuBLAS) on the local GPU; one Measurement each.

    A config over `SCREEN` times slower than the best Triton config before it is timed from
    one replay (its p10 = median = p90).

    Runs inside a `WorkerPool` child: a `crashed` row (any other exception, a CUDA error
    among them, after which the context is unusable) ends the child, and the pool starts a
    fresh one for the configs after it.
    """
    profile = Phases(problem.key, enabled=bool(os.environ.get("GNN_POLICY_PROFILE")))
    spec = hardware_specs.load(gpu)
    stream = None
    if spec.slice_of:
        from gnn_policy.measure.slices import slice_stream

        stream = slice_stream(spec.sm_count, torch.cuda.current_device())
    bench = Bench(problem, spec.l2_bytes, seed=seed, stream=stream)
    base = dict(gpu=gpu, problem=problem.key, versions=environment())
    best_ms = float("inf")  # of the Triton configs so far: cuBLAS must not coarsen their ranking
    profile.lap("setup")
    for config in configs:
        key = config.key if config else CUBLAS
        try:
            checked = bench.check(config) if config else None
            profile.lap("check")
            if checked and not checked.ok:
                yield Measurement(config=key, status="wrong_result", max_rel_err=checked.error, **base)
                profile.lap("report")
                continue
            if config:
                t = bench.time(config, replays, screen_ms=SCREEN * best_ms)
                best_ms = min(best_ms, t.median_ms)
            else:
                t = bench.time_cublas(replays)
            profile.lap("time", gpu_s=(t.replays + 2) * t.calls_per_replay * t.median_ms / 1e3)
            yield Measurement(config=key, status="ok", median_ms=t.median_ms, p10_ms=t.p10_ms,
                              p90_ms=t.p90_ms, tflops=t.tflops(problem.flops), sm_mhz=sm_clock_mhz(),
                              max_rel_err=checked.error if checked else None, **base)
        except Exception as exc:  # noqa: BLE001 - every outcome is a row
            yield Measurement(config=key, status=_status_of(exc), error=f"{type(exc).__name__}: {exc}"[:500], **base)
        profile.lap("report")
    profile.print(len(configs))


class Phases:
    """Where a measuring child's time goes (GNN_POLICY_PROFILE=1): one stderr line per problem.

    `time` includes the replays themselves; `gpu_replays` estimates them (replays x median),
    so `time - gpu_replays` is the capture and launch overhead.
    """

    def __init__(self, problem: str, enabled: bool):
        self.problem, self.enabled, self.seconds, self.last = problem, enabled, {}, time.perf_counter()

    def lap(self, name: str, gpu_s: float = 0.0) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.seconds["gpu_replays"] = self.seconds.get("gpu_replays", 0.0) + gpu_s
        self.last = now

    def print(self, configs: int) -> None:
        if not self.enabled:
            return
        parts = " ".join(f"{k}={v * 1e3 / max(1, configs):.2f}" for k, v in self.seconds.items())
        print(f"phases {self.problem} configs={configs} ms/config: {parts}", file=sys.stderr, flush=True)
