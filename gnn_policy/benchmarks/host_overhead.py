"""Host time of one `gnn_policy.matmul` call before Triton's launcher, on any machine.

    TRITON_INTERPRET=1 python -m gnn_policy.benchmarks.host_overhead

Two figures per call, in microseconds (median of --repeats batches of --calls calls):
- `matmul`: the Python of `ops.matmul` before `launch` (operand checks, the problem, the cached
  policy pick), with `launch` stood in by an empty output;
- `_prepare <variant>`: `kernels.launch._prepare` alone (output, descriptors, grid, arguments)
  for a pointer, a TMA and a persistent config.
What it leaves out is Triton's own launcher and the CUDA launch, which need a GPU. fp16 on a
CPU (the interpreter refuses bf16), a decode-sized shape with `nn.Linear`'s column-major weight.
"""
from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

from gnn_policy import ops
from gnn_policy.kernels import launch
from gnn_policy.space import TileConfig


def per_call_us(fn, calls: int, repeats: int) -> float:
    fn()  # the first call picks and caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="16x4096x4096", help="MxNxK")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ns = ap.parse_args(argv)
    m, n, k = (int(x) for x in ns.shape.split("x"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(m, k, dtype=torch.float16, device=device)
    b = torch.randn(n, k, dtype=torch.float16, device=device).t()  # nn.Linear's weight as W.T
    rows = []
    stand_in = lambda a, b, config, **_: torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)  # noqa: E731
    with torch.no_grad(), mock.patch.object(ops, "launch", stand_in):
        rows.append(("matmul (launch stood in)", per_call_us(lambda: ops.matmul(a, b), ns.calls, ns.repeats)))
    for variant in ("ptr", "tma", "persistent"):
        config = TileConfig(64, 128, 64, 1, 8, 4, 3, variant)
        rows.append((f"_prepare {variant}", per_call_us(
            lambda c=config: launch._prepare(a, b, c, None, None, None, None), ns.calls, ns.repeats)))
    print(f"host time per call, {ns.shape} fp16 on {device}:")
    for name, us in rows:
        print(f"  {name:<26} {us:7.1f} us")


if __name__ == "__main__":
    main()
