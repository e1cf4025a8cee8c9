"""`gnn-policy demo`: the template on a handful of problems, each checked against torch.

On a CPU-only machine it runs through Triton's interpreter, with small shapes and without
bf16 (the interpreter's bf16 `tl.dot` is wrong: bf16 is checked on the GPU).
"""
from __future__ import annotations

import time

import torch

from graphs import GemmProblem
from gnn_policy.kernels.reference import TOLERANCE, reference, relative_error
from gnn_policy.measure.inputs import TORCH_DTYPES, make_inputs
from gnn_policy.ops import chosen_config, gpu_for, matmul_and_config
from gnn_policy.space import TileConfig

CPU_CASES = [
    (GemmProblem(64, 96, 80, dtype="fp16", bias=True, activation="gelu"), None),
    (GemmProblem(33, 100, 7, dtype="fp32", b_layout="col"), TileConfig(32, 32, 16, 1, 4, 2, 2, "ptr")),
    (GemmProblem(16, 64, 128, dtype="fp16", residual=True), TileConfig(16, 32, 32, 4, 8, 2, 2, "tma")),
    (GemmProblem(40, 48, 64, batch=2, dtype="fp16", a_layout="col", activation="silu"),
     TileConfig(16, 16, 32, 2, 1, 2, 3, "tma")),
]
GPU_CASES = [
    (GemmProblem(4096, 4096, 4096, dtype="bf16"), None),
    (GemmProblem(1000, 1000, 1000, dtype="bf16", bias=True, activation="gelu"), None),
    (GemmProblem(16, 4096, 4096, dtype="bf16", residual=True), None),
    (GemmProblem(8, 512, 768, batch=12, dtype="fp16", b_layout="col", activation="relu"), None),
    (GemmProblem(300, 500, 700, dtype="fp32"), None),
]


def demo(seed: int = 0) -> int:
    """Print one line per problem; return 1 if any result is out of tolerance."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = GPU_CASES if device == "cuda" else CPU_CASES
    gpu = gpu_for(torch.device(device))
    mode = "GPU" if device == "cuda" else "Triton interpreter (CPU)"
    print(f"gnn_policy.matmul on {mode}, validity rules of {gpu.name}")
    print(f"{'problem':<34} {'config':<44} {'rel err':>9} {'tol':>7} {'s':>6}  result")
    failed = 0
    for i, (problem, config) in enumerate(cases):
        args = make_inputs(problem, device, seed=seed + i)
        start = time.perf_counter()
        out, ran = matmul_and_config(**args, config=config)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        err = relative_error(out, reference(**args))
        tol = TOLERANCE[TORCH_DTYPES[problem.dtype]]
        source = ""
        if config is None:
            chosen, source = chosen_config(problem, gpu)
            source += "" if ran == chosen else ", pointer loads: TMA refused these tensors"
        ok = err <= tol
        failed += not ok
        label = ran.key + (f" ({source})" if source else "")
        print(f"{problem.key:<34} {label:<44} {err:9.2e} {tol:7.0e} {seconds:6.2f}  {'ok' if ok else 'WRONG'}")
    return 1 if failed else 0
