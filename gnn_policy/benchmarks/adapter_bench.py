"""The policy's `prune_configs_by` adapter on a user's tutorial-style kernel: full autotune against
the adapter at k = 1, 2, 4. Needs a CUDA GPU; about 3-4 minutes on the H200.

    python -m gnn_policy.benchmarks.adapter_bench --out docs/data/adapter

The kernel is `benchmarks/tutorial_kernel.py`: tutorial 03's matmul with the tutorial's names
(BLOCK_SIZE_M, ...), `triton.autotune` over the tutorial's 16 CUDA configs, key M, N, K. Each
method runs in its own process with an empty Triton cache, as a user's first run would, over
the same fp16 shapes (B row-major, as the tutorial's):
- `full`: the autotuner benchmarks all 16 configs;
- `policy-k`: the same with `prune_configs_by=autotune_pruner(policy, k, gpu, ...)`.
Tuning time is the wall time of a shape's first call (compiles and benchmarks its configs;
shapes of one specialisation share compiled kernels, for every method alike). Kernel time is
the chosen config's, by CUDA-graph replay over rotated inputs (`measure.timing.time_graph`);
quality is full autotune's kernel time over the method's (1.0: as fast as full autotune's
pick). The policy's load is timed apart. Writes `adapter.json` and `adapter.md` in --out.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

SHAPES = ((16, 4096, 4096), (128, 4096, 4096), (512, 4096, 4096), (2048, 4096, 4096), (4096, 4096, 4096),
          (128, 14336, 4096), (2048, 4096, 14336), (1000, 1000, 1000), (3072, 768, 768), (64, 1024, 8192))
METHODS = ("full", "policy-1", "policy-2", "policy-4")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for adapter.json and adapter.md")
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                    help="MxNxK,... (default: ten shapes from decode to large prefill)")
    ap.add_argument("--methods", default=",".join(METHODS), help="full and/or policy-K, comma-separated")
    ap.add_argument("--checkpoint", default="", help="policy checkpoint (default: checkpoints/pretrained.pt)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one method, in a fresh process
    ns = ap.parse_args(argv)
    ns.shapes = [tuple(int(x) for x in s.split("x")) for s in ns.shapes.split(",")]
    ns.methods = ns.methods.split(",")
    bad = [m for m in ns.methods if m != "full" and not (m.startswith("policy-") and m[7:].isdigit())]
    if bad or any(len(s) != 3 for s in ns.shapes):
        ap.error(f"methods are full or policy-K (got {bad}); shapes are MxNxK")
    return ns


def _kernel_ms(kernel, problem, gpu) -> tuple[float, float]:
    """(chosen config's time by graph replay over rotated inputs, its relative error vs float64)."""
    from gnn_policy.benchmarks.tutorial_kernel import matmul
    from gnn_policy.kernels.reference import reference, relative_error
    from gnn_policy.measure.inputs import make_inputs
    from gnn_policy.measure.timing import rotation_count, time_graph

    sets = [make_inputs(problem, "cuda", seed=i) for i in range(rotation_count(problem.bytes_min(), gpu.l2_bytes))]
    error = relative_error(matmul(kernel, sets[0]["a"], sets[0]["b"]), reference(sets[0]["a"], sets[0]["b"]))
    return time_graph(lambda i: matmul(kernel, sets[i]["a"], sets[i]["b"]), len(sets)).median_ms, error


def worker(ns: argparse.Namespace) -> list[dict]:
    """Tune every shape with one method in this process; one row per shape."""
    import torch

    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy import config_names
    from gnn_policy.benchmarks.tutorial_kernel import autotuned, matmul, tutorial_configs
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy, autotune_pruner

    gpu, method, rows = hardware_specs.detect(), ns.worker, []
    prune, load_s = None, 0.0
    if method != "full":
        start = time.perf_counter()
        policy = Policy.load(ns.checkpoint or DEFAULT_CHECKPOINT)
        load_s = time.perf_counter() - start
        prune = autotune_pruner(policy, int(method[7:]), gpu,
                                lambda a: GemmProblem(a["M"], a["N"], a["K"], dtype="fp16"))
    for m, n, k in ns.shapes:
        kernel = autotuned(tutorial_configs(), prune)
        problem = GemmProblem(m, n, k, dtype="fp16")
        a, b = torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(k, n, device="cuda", dtype=torch.float16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            matmul(kernel, a, b)
            torch.cuda.synchronize()
            tuning_s = time.perf_counter() - start
        kernel_ms, error = _kernel_ms(kernel, problem, gpu)
        chosen = config_names.read(kernel.best_config)
        timings = getattr(kernel, "configs_timings", None)  # unset when pruning left one config: nothing timed
        rows.append({"method": method, "shape": [m, n, k], "tuning_s": round(tuning_s, 3), "policy_load_s": round(load_s, 2),
                     "configs_timed": len(timings) if timings else 1,
                     "chosen": chosen.key if chosen else str(kernel.best_config), "kernel_ms": round(kernel_ms, 5),
                     "rel_err": error, "warnings": [str(w.message) for w in caught if "autotune_pruner" in str(w.message)]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _run_method(method: str, ns: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        cmd = [sys.executable, "-m", "gnn_policy.benchmarks.adapter_bench", "--out", str(ns.out), "--worker", method,
               "--shapes", ",".join("x".join(map(str, s)) for s in ns.shapes), "--checkpoint", ns.checkpoint]
        res = subprocess.run(cmd, env=dict(os.environ, TRITON_CACHE_DIR=cache), capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"adapter_bench: method {method} failed:\n{res.stderr[-3000:]}")
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def table(rows: list[dict]) -> str:
    """Markdown: per shape, each method's tuning time, kernel time and quality; then totals."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(tuple(r["shape"]), r["method"]): r for r in rows}
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
    head = "| M | N | K | " + " | ".join(f"{m}: tune s | {m}: kernel ms" + (f" | {m}: quality" if m != "full" else "")
                                         for m in methods) + " |"
    lines = [head, "|" + "---|" * (3 + sum(2 if m == "full" else 3 for m in methods))]
    for s in shapes:
        cells = [str(x) for x in s]
        for m in methods:
            r = by.get((s, m))
            full = by.get((s, "full"))
            cells += [f"{r['tuning_s']:.2f}", f"{r['kernel_ms']:.4f}"] if r else ["-", "-"]
            if m != "full":
                cells.append(f"{full['kernel_ms'] / r['kernel_ms']:.3f}" if r and full else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for m in methods:
        mine = [by[(s, m)] for s in shapes if (s, m) in by]
        quality = [by[(s, "full")]["kernel_ms"] / r["kernel_ms"] for s, r in zip(shapes, mine) if (s, "full") in by]
        gq = f", geomean quality {math.exp(sum(map(math.log, quality)) / len(quality)):.3f}" if quality and m != "full" else ""
        warned = sum(bool(r["warnings"]) for r in mine)
        lines.append(f"- {m}: tuning {sum(r['tuning_s'] for r in mine):.1f} s over {len(mine)} shapes{gq}"
                     + (f", policy load {mine[0]['policy_load_s']} s" if mine and mine[0]["policy_load_s"] else "")
                     + (f", pruner warnings on {warned} shapes" if warned else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ns = parse(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("adapter_bench needs a CUDA GPU: it compiles and times Triton kernels")
    if ns.worker:
        worker(ns)
        return
    rows = [r for method in ns.methods for r in _run_method(method, ns)]
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "adapter.json").write_text(json.dumps(rows, indent=1) + "\n")
    (ns.out / "adapter.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
