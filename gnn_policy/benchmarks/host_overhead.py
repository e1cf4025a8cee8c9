"""Host time of one `gnn_policy.matmul` call, before Triton's launcher on any machine, and whole
launches on a GPU.

    TRITON_INTERPRET=1 python -m gnn_policy.benchmarks.host_overhead
    python -m gnn_policy.benchmarks.host_overhead --profile host.prof.txt     # on a GPU

Two figures per call, in microseconds (median of --repeats batches of --calls calls):
- `matmul`: the Python of `ops.matmul` before `launch` (operand checks, the problem, the cached
  policy pick), with `launch` stood in by an empty output;
- `prepare <variant>`: `kernels.launch.prepare` alone (output, descriptors, grid, arguments)
  for a pointer, a TMA and a persistent config.
On a CUDA GPU it adds whole calls: `F.linear` (torch's eager, the reference), a patched
`TritonLinear`, `ops.matmul` with a given config per variant, Triton's launcher alone
(`kernel[grid](...)` on arguments prepared once) and a launch plan's call (`kernels/plan.py`,
not for the persistent variant). A GPU row is the host time to enqueue a call:
batches of --calls calls (fewer than the launch queue holds, so enqueueing never waits on the
GPU) are timed up to the last launch and synchronised only after. `--profile FILE` writes
cProfile's top functions of the patched layer's calls there. fp16 on a CPU (the interpreter
refuses bf16), bf16 on a GPU; a decode-sized shape with `nn.Linear`'s column-major weight.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from gnn_policy import ops
from gnn_policy.kernels import launch
from gnn_policy.space import TileConfig


def per_call_us(fn, calls: int, repeats: int) -> float:
    fn()  # the first call picks, compiles and caches
    cuda = torch.cuda.is_available()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(times)


def gpu_rows(a: torch.Tensor, b: torch.Tensor, calls: int, repeats: int, profile: Path | None) -> list:
    """Whole calls on the GPU: torch's eager Linear, the patched layer, matmul and the launcher."""
    from gnn_policy.kernels.plan import make_plan
    from gnn_policy.patching import TritonLinear

    linear = torch.nn.Linear(b.shape[0], b.shape[1], bias=False, device=a.device, dtype=a.dtype)
    patched = TritonLinear(linear)
    rows = [("F.linear (torch eager)", per_call_us(lambda: F.linear(a, linear.weight), calls, repeats)),
            ("TritonLinear (policy pick)", per_call_us(lambda: patched(a), calls, repeats))]
    for variant in ("ptr", "tma", "persistent"):
        config = TileConfig(64, 128, 64, 1, 8, 4, 3, variant)
        try:
            rows.append((f"ops.matmul {variant}", per_call_us(lambda c=config: ops.matmul(a, b, config=c), calls, repeats)))
        except ops.InvalidConfigError as exc:  # a GPU whose rules refuse it: say so, time the rest
            print(f"  {variant}: {exc}")
            continue
        kernel, _, g, args, meta = launch.prepare(a, b, config, None, None, None, None)
        if kernel is not launch.matmul_kernel:  # a persistent grid is set in `_run`
            args, g = launch._programs(kernel, args, meta, config, a.device, None)
        rows.append((f"launcher alone {variant}", per_call_us(lambda: kernel[g](*args, **meta), calls, repeats)))
        _, plan = make_plan(a, b, config, bias=None, activation=None, residual=None)
        if plan is not None:
            rows.append((f"plan.run {variant}", per_call_us(lambda p=plan: p.run(a, b, None, None), calls, repeats)))
    if profile is not None:
        prof = cProfile.Profile()
        prof.runcall(lambda: [patched(a) for _ in range(calls)])
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        profile.write_text(f"{calls} calls of TritonLinear on {tuple(a.shape)} x {tuple(b.shape)}\n" + out.getvalue())
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="16x4096x4096", help="MxNxK")
    ap.add_argument("--calls", type=int, default=500, help="calls a batch (under the GPU launch queue's depth)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--profile", type=Path, help="write cProfile's top functions of the patched layer here (GPU)")
    ns = ap.parse_args(argv)
    m, n, k = (int(x) for x in ns.shape.split("x"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(n, k, dtype=dtype, device=device).t()  # nn.Linear's weight as W.T
    rows = []
    stand_in = lambda a, b, config, **_: torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)  # noqa: E731
    with torch.no_grad(), mock.patch.object(ops, "launch", stand_in):
        rows.append(("matmul (launch stood in)", per_call_us(lambda: ops.matmul(a, b), ns.calls, ns.repeats)))
    for variant in ("ptr", "tma", "persistent"):
        config = TileConfig(64, 128, 64, 1, 8, 4, 3, variant)
        rows.append((f"prepare {variant}", per_call_us(
            lambda c=config: launch.prepare(a, b, c, None, None, None, None), ns.calls, ns.repeats)))
    if device == "cuda":
        with torch.no_grad():
            rows += gpu_rows(a, b, ns.calls, ns.repeats, ns.profile)
    print(f"host time per call, {ns.shape} {str(dtype)[6:]} on {device}:")
    for name, us in rows:
        print(f"  {name:<26} {us:7.1f} us")


if __name__ == "__main__":
    main()
