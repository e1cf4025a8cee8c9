"""What the compiler gives each config: shared memory, registers, spills, warps, and whether
Triton's Hopper warp specialisation took (it moves registers with `setmaxnreg`). Checks the
validity rules of `space.py` against the compiled kernels: a config the rules accept must fit
the GPU without spilling, and a `warpspec` config the rules accept must be specialised.

Runs on the GPU machine (compiles in parallel processes, loads each kernel to read its
registers):
    python -m gnn_policy.benchmarks.resources --variant persistent --variant warpspec --configs 400 --out resources.jsonl
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
from collections import Counter

SHAPE = (1000, 1000, 4096)  # unaligned M and N: masks and TMA clipping both compiled in


def _compile(job: tuple[str, str]) -> dict:
    import torch

    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy.kernels.launch import compile_kernel
    from gnn_policy.measure.inputs import make_inputs
    from gnn_policy.space import TileConfig, violations

    key, dtype = job
    config = TileConfig.from_key(key)
    gpu = hardware_specs.detect()
    problem = GemmProblem(*SHAPE, dtype=dtype, b_layout="col")
    out = dict(config=key, dtype=dtype, rules=[v.rule for v in violations(config, gpu, dtype, SHAPE[2])])
    try:
        args = make_inputs(problem, "cuda", fill=False)
        kernel = compile_kernel(args["a"], args["b"], config, bias=None, activation=None, residual=None)
        kernel._init_handles()
        out.update(status="ok", smem=kernel.metadata.shared, warps=kernel.metadata.num_warps,
                   regs=kernel.n_regs, spills=kernel.n_spills,
                   specialised=kernel.asm["ptx"].count("setmaxnreg") > 0)
    except Exception as exc:  # noqa: BLE001 - an out-of-resources load is the finding
        out.update(status=type(exc).__name__, error=str(exc)[:200])
    torch.cuda.empty_cache()
    return out


def verdict(row: dict, smem_limit: int) -> str:
    """'ok' where rules and compiler agree; otherwise what the rules missed or over-ruled."""
    accepted = not row["rules"]
    fits = row.get("status") == "ok" and row["smem"] <= smem_limit and not row["spills"]
    if row["config"].endswith("_warpspec") and row.get("status") == "ok":
        fits = fits and row["specialised"]
    if accepted and not fits:
        return "rules_too_loose"
    # `warpspec-sm90` is a finding on the GPU, which a compile that fits cannot contradict
    if not accepted and fits and set(row["rules"]) <= {"smem", "registers", "warpspec"}:
        return "rules_too_strict"
    return "ok"


def main(argv: list[str] | None = None) -> None:
    import hardware_specs
    from gnn_policy.space import space

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--configs", type=int, default=400)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    jobs = []
    for variant in args.variant:
        pool = [c.key for c in space("hopper-all") if c.variant == variant]
        jobs += [(k, args.dtype) for k in rng.sample(pool, min(args.configs, len(pool)))]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        rows = pool.map(_compile, jobs, chunksize=4)
    limit = hardware_specs.detect().smem_per_block_bytes
    tally = Counter()
    with open(args.out, "w") as f:
        for row in rows:
            row["verdict"] = verdict(row, limit)
            tally[(row["config"].rsplit("_", 1)[1], row["verdict"])] += 1
            f.write(json.dumps(row) + "\n")
    for (variant, v), n in sorted(tally.items()):
        print(f"{variant:11s} {v:16s} {n}")
    for row in rows:
        if row["verdict"] != "ok":
            print(row["verdict"], row["config"], row.get("smem"), row.get("regs"), row.get("spills"),
                  row.get("specialised"), row["rules"], row.get("status"))


if __name__ == "__main__":
    main()
