"""One launch of a config and one of cuBLAS, bracketed for a profiler.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \\
        --section Occupancy --section WarpStateStats \\
        python -m gnn_policy.benchmarks.profile_launch 1000,1000,1000:bm128_bn64_bk64_sk1_gm8_w4_s4_tma \
        1x256x4544x4544_bf16_rc:bm128_bn128_bk64_sk1_gm8_w4_s4_streamk

A case is M,N,K (fp16, row-major) or a problem key (any dtype, layout, batch or epilogue).

Each case is warmed up (compiled, cuBLAS handles created) first; only the bracketed launches
are profiled (`--profile-from-start off`), our kernel then cuBLAS's, per case.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    import torch

    from graphs import GemmProblem
    from gnn_policy import TileConfig, matmul
    from gnn_policy.measure.inputs import make_inputs

    cases = []
    for spec in (sys.argv[1:] if argv is None else argv):
        shape, key = spec.split(":")
        problem = GemmProblem.from_key(shape) if "_" in shape else GemmProblem(*(int(x) for x in shape.split(",")))
        args = make_inputs(problem, "cuda", seed=0)
        config = TileConfig.from_key(key)
        for _ in range(3):
            matmul(**args, config=config)
            torch.matmul(args["a"], args["b"])  # cuBLAS without the epilogue: the GEMM alone
        cases.append((args, config))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for args, config in cases:
        matmul(**args, config=config)
        torch.matmul(args["a"], args["b"])
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    sys.exit(main())
