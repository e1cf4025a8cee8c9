"""How long `Policy.top_k` takes on this machine's CPU, for a new shape and for one asked before.

    python -m gnn_policy.benchmarks.policy_latency --checkpoint checkpoints/pretrained.pt

`load_ms`: `Policy.load`. `cold_ms`: the first call of each dtype in a process, which also
builds the GPU's validity mask for the dtype and, for a bounded cost model, its config table.
Then each of `SHAPES` (aligned model shapes, odd sizes, short K, batched; each with row- and
column-major B, in bf16 and fp16: 48 problems) is timed `--repeats` times as a new shape
(`new`: the policy's cache of scores emptied first, so it encodes, scores every valid config
and picks) and as a shape asked before (`cached`). Reported: the median over the shapes of
each shape's median, the worst shape's median and the worst single call, in ms of wall time
and of this process's CPU time (CPU time well below wall time means other processes held the
cores), with torch's thread count and the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy

SIZES = (  # (batch, M, N, K)
    (1, 1, 4096, 4096),  # decode
    (1, 16, 14336, 4096),  # decode, an MLP's up projection
    (1, 1, 128256, 4096),  # an LM head
    (1, 4096, 4096, 4096),
    (1, 8192, 8192, 8192),
    (1, 3000, 5120, 13824),  # an odd token count
    (1, 77, 1000, 333),  # odd everything: no TMA, narrow pointer loads
    (1, 1000, 1000, 1000),  # rows of 1000 elements
    (1, 8191, 16383, 127),  # odd, short K
    (1, 8192, 8192, 16),  # K of one tile: few valid configs
    (8, 512, 512, 64),  # batched, attention-like
    (32, 128, 128, 4096),  # batched
)
EPILOGUES = ({}, {"bias": True, "activation": "gelu"}, {"activation": "silu", "residual": True})
SHAPES = tuple(GemmProblem(m, n, k, batch=batch, dtype=dtype, b_layout=layout, **EPILOGUES[i % len(EPILOGUES)])
               for dtype in ("bf16", "fp16") for layout in ("row", "col") for i, (batch, m, n, k) in enumerate(SIZES))


def _timed(fn) -> tuple[float, float]:
    """(wall ms, CPU ms) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def _summary(per_shape: list[list[tuple[float, float]]]) -> dict:
    out = {}
    for i, clock in enumerate(("wall", "cpu")):
        medians = [statistics.median(t[i] for t in times) for times in per_shape]
        out[clock] = {"median": round(statistics.median(medians), 2), "worst_shape": round(max(medians), 2),
                      "worst_call": round(max(t[i] for times in per_shape for t in times), 2)}
    return out


def measure(policy: Policy, gpu, k: int, repeats: int) -> dict:
    cold = {}
    for dtype in dict.fromkeys(p.dtype for p in SHAPES):
        cold[dtype] = round(_timed(lambda: policy.top_k(GemmProblem(4096, 4096, 4096, dtype=dtype), gpu, k))[0], 1)
    new, cached = [], []
    for p in SHAPES:
        new.append([])
        for _ in range(repeats):
            policy._scores.clear()  # a new shape for the policy; the GPU's masks and tables stay built
            new[-1].append(_timed(lambda: policy.top_k(p, gpu, k)))
        cached.append([_timed(lambda: policy.top_k(p, gpu, k)) for _ in range(repeats)])
    return {"cold_ms": cold, "shapes": len(SHAPES), "repeats": repeats, "k": k,
            "new_ms": _summary(new), "cached_ms": _summary(cached)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=8)
    ns = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    policy = Policy.load(ns.checkpoint)
    load_ms = round((time.perf_counter() - start) * 1e3, 1)
    result = measure(policy, hardware_specs.load(ns.gpu), ns.k, ns.repeats)
    print(json.dumps({"load_ms": load_ms, **result, "torch_threads": torch.get_num_threads(),
                      "scoring_threads": os.environ.get("GNN_POLICY_THREADS", "default"),
                      "loadavg_before_after": [load_before, os.getloadavg()[0]]}, indent=1))


if __name__ == "__main__":
    main()
