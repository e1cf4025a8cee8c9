"""What the compiler made of a config: registers, spills, shared memory, instruction counts.

    python -m gnn_policy.benchmarks.inspect_ptx --shape 1000,1000,1000 --config bm128_bn128_bk64_sk1_gm8_w4_s4_ptr

Compiles (no launch) on the local GPU and counts the PTX instructions that decide speed on
Hopper: wgmma vs mma.sync, TMA bulk copies vs cp.async vs plain loads, and the width of
global stores. Costs no timing, so it is the first thing to read when a config is slow.
"""
from __future__ import annotations

import argparse
import re
import sys

PATTERNS = ("wgmma.mma_async", "mma.sync", "cp.async.bulk.tensor", "cp.async.cg.shared.global",
            "ld.global.v4", "ld.global.b16", "st.global.v4", "st.global.b16")


def inspect(m: int, n: int, k: int, key: str, dtype: str = "bf16") -> dict:
    from graphs import GemmProblem
    from gnn_policy.kernels.launch import compile_kernel
    from gnn_policy.measure.inputs import make_inputs
    from gnn_policy.space import TileConfig

    args = make_inputs(GemmProblem(m, n, k, dtype=dtype), "cuda", fill=False)
    kernel = compile_kernel(args["a"], args["b"], TileConfig.from_key(key), bias=None,
                            activation=None, residual=None)
    kernel._init_handles()  # loads the binary: registers and spills are known only then
    ptx = kernel.asm["ptx"]
    counts = {p: len(re.findall(re.escape(p), ptx)) for p in PATTERNS}
    return {"registers": kernel.n_regs, "spills": kernel.n_spills,
            "shared_bytes": kernel.metadata.shared, **counts}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="M,N,K")
    ap.add_argument("--config", required=True, action="append", help="TileConfig key (repeatable)")
    ap.add_argument("--dtype", default="bf16")
    ns = ap.parse_args(argv)
    m, n, k = (int(x) for x in ns.shape.split(","))
    for key in ns.config:
        print(f"{m}x{n}x{k} {key}: {inspect(m, n, k, key, ns.dtype)}")


if __name__ == "__main__":
    sys.exit(main())
