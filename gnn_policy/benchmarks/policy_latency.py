"""How long `Policy.top_k` takes on this machine's CPU, for a new shape and for one asked before.

    python -m gnn_policy.benchmarks.policy_latency --checkpoint checkpoints/pretrained.pt

The first call of a process also builds the GPU's validity mask for the dtype and, for a
bounded cost model, its config table (reported apart as `cold`). Then for `--shapes` random
shapes never asked before (random layouts and epilogues, bf16), the first call (`new`: encode,
score every valid config, pick) and a second call (`cached`) are timed; median and worst, ms.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy


def _shape(rng: random.Random) -> GemmProblem:
    return GemmProblem(rng.randint(1, 8192), rng.randint(64, 16384), rng.randint(64, 16384),
                       b_layout=rng.choice(["row", "col"]), bias=rng.random() < 0.5,
                       activation=rng.choice([None, "gelu", "silu"]))


def measure(policy: Policy, gpu, shapes: int, k: int, seed: int) -> dict:
    rng = random.Random(seed)
    start = time.perf_counter()
    policy.top_k(GemmProblem(4096, 4096, 4096), gpu, k)
    cold = time.perf_counter() - start
    new, cached = [], []
    for _ in range(shapes):
        p = _shape(rng)
        for times in (new, cached):
            start = time.perf_counter()
            policy.top_k(p, gpu, k)
            times.append((time.perf_counter() - start) * 1e3)
    return {"cold_ms": round(cold * 1e3, 1), "shapes": shapes, "k": k, "threads": torch.get_num_threads(),
            **{f"{name}_ms": {"median": round(statistics.median(t), 2), "max": round(max(t), 2)}
               for name, t in (("new", new), ("cached", cached))}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--shapes", type=int, default=50)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    policy = Policy.load(ns.checkpoint)
    print(json.dumps(measure(policy, hardware_specs.load(ns.gpu), ns.shapes, ns.k, ns.seed), indent=1))


if __name__ == "__main__":
    main()
