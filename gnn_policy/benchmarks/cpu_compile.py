"""Compile configs for sm_90 on a machine without a GPU, to find what the compiler refuses or
aborts on before device time is spent on it.

Triton's compiler runs on the CPU; only loading a kernel needs the GPU. The arguments are
specialised as a launch would specialise them (dtype, 16-byte divisibility of sizes, strides
and pointers, TMA descriptors), so a config that aborts here aborts there: on the H200,
Triton 3.6 killed its process compiling warp-specialised 64x256 tiles, and this reproduced it.
Aborted compiles cost one job each (`CompilePool`), never the run. A compiled kernel whose TMA
copies land in buffers of another size than the tensor map's box is a `tma_box_mismatch`: its
barrier waits for bytes that never come, and such kernels hung on the H100 and the H200
(`warpspec` with host-side maps, docs/BENCHMARKS.md).

    python -m gnn_policy.benchmarks.cpu_compile --variant persistent --configs 200 --shapes 8 --out cc.jsonl
    python -m gnn_policy.benchmarks.cpu_compile --problem 1x4096x4096x4096_bf16_rr \
        --config bm128_bn256_bk64_sk1_gm8_w8_s4_subtile --out cc.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import Counter

from gnn_policy.measure.compile import CompilePool, CompileResult

TARGET = ("cuda", 90, 32)  # the H200's compute capability and warp size
_COPY = re.compile(r"!tt\.tensordesc<tensor<([0-9x]+)x\w+.*-> !ttg\.memdesc<([0-9x]+)x\w+")


def tma_box_mismatches(ttgir: str) -> list[str]:
    """The TMA loads of a compiled kernel (its TTGIR) that copy a tensor map's box into a
    shared-memory buffer of another number of elements, as 'box -> buffer'."""
    out = []
    for line in ttgir.splitlines():
        if "async_tma_copy_global_to_local" in line and (found := _COPY.search(line)):
            box, buffer = found.groups()
            if math.prod(map(int, box.split("x"))) != math.prod(map(int, buffer.split("x"))):
                out.append(f"{box} -> {buffer}")
    return out


def compile_sm90(job: tuple) -> CompileResult:
    """Compile one (problem, config) for sm_90 with CPU tensors standing in for the GPU's."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from gnn_policy.kernels.launch import LayoutError, prepare
    from gnn_policy.measure.inputs import make_inputs

    problem, config, _ = job
    start = time.perf_counter()
    try:
        args = make_inputs(problem, "cpu", fill=False)
        kernel, _, _, kargs, meta = prepare(args["a"], args["b"], config, args["bias"], args["activation"],
                                            args["residual"], None, compile_only=True)
        target = GPUTarget(*TARGET)
        backend = make_backend(target)
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*kargs, **meta)
        options, signature, constexprs, attrs = kernel._pack_args(backend, meta, bound, specialization, options)
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        status, error = "ok", f"smem={compiled.metadata.shared} warps={compiled.metadata.num_warps}"
        if mismatched := tma_box_mismatches(compiled.asm["ttgir"]):
            status, error = "tma_box_mismatch", f"{error}; TMA box into a buffer of another size: {', '.join(mismatched)}"
    except LayoutError as exc:
        status, error = "invalid", str(exc)
    except Exception as exc:  # noqa: BLE001 - a compiler error is the finding
        status, error = "compile_error", f"{type(exc).__name__}: {exc}"[:300]
    return CompileResult(problem.key, config.key, status, time.perf_counter() - start, error)


def main(argv: list[str] | None = None) -> None:
    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy.benchmarks.ceiling import problems, sweep_configs
    from gnn_policy.space import TileConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[], help="the ceiling's sweep of this variant")
    parser.add_argument("--config", action="append", default=[],
                        help="a config key to compile for every --problem (repeatable), instead of a sweep")
    parser.add_argument("--problem", action="append", default=[], help="a problem key, e.g. 1x256x4544x4544_bf16_rc")
    parser.add_argument("--configs", type=int, default=100, help="per (shape, variant), in the ceiling's order")
    parser.add_argument("--shapes", type=int, default=0, help="the ceiling's first N shapes (0: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    gpu = hardware_specs.load("h200")
    if bool(args.config) != bool(args.problem) or bool(args.config) == bool(args.variant):
        parser.error("give --variant (a sweep of the ceiling's shapes) or --config with --problem")
    jobs = [(GemmProblem.from_key(p), TileConfig.from_key(c)) for p in args.problem for c in args.config]
    jobs += [(p, c) for _, p in problems(args.shapes) for v in args.variant
             for c in sweep_configs(p, v, args.configs, gpu, 0)]
    if not jobs:
        parser.error(f"the H200's rules leave no config of {', '.join(args.variant)} to compile "
                     "(warpspec: refused on Hopper, where it hangs)")
    tally: Counter = Counter()
    with CompilePool(args.workers, timeout_s=300.0, fn=compile_sm90, grace_s=60.0) as pool, open(args.out, "w") as f:
        for result in pool.stream(jobs):
            tally[result.status] += 1
            f.write(json.dumps(result.__dict__) + "\n")
            f.flush()
            print(result.status, result.problem, result.config, result.error[:120], flush=True)
    print(dict(tally))


if __name__ == "__main__":
    main()
