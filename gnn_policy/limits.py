"""How large a GEMM the template addresses and a GPU holds: the limits problems are refused by.

`gnn_policy.matmul` checks its tensors against the same constants, and the command line checks
a problem's sizes before it ranks configs for something no kernel here could run. No torch or
Triton import: the command line reads these while it parses.
"""
from __future__ import annotations

INT32_MAX = 2**31 - 1  # the template computes element offsets in 32-bit integers
MAX_BATCH = 65535  # the batch is the grid's second axis, which CUDA caps at 65535


class ProblemTooLarge(ValueError):
    """The GEMM exceeds what the template addresses or what the GPU's memory holds."""


def addressing_error(m: int, n: int, k: int, batch: int = 1) -> str | None:
    """Why the template cannot address this GEMM with contiguous operands, or None when it can."""
    if batch > MAX_BATCH:
        return f"batch {batch} exceeds the grid limit of {MAX_BATCH}"
    for name, rows, cols in (("A", m, k), ("B", k, n), ("C", m, n)):
        if batch * rows * cols - 1 > INT32_MAX:
            dims = f"{'batch x ' if batch > 1 else ''}{rows} x {cols}"
            return (f"{name} spans {dims} = {batch * rows * cols:,} elements, more than the 2**31 the "
                    "template addresses with 32-bit offsets; split the problem")
    return None


def check_fits(problem, gpu) -> None:
    """Raise ProblemTooLarge unless `problem` (a GemmProblem) can run on `gpu` (a GpuSpec)."""
    why = addressing_error(problem.m, problem.n, problem.k, problem.batch)
    if why is None and problem.bytes_min() > gpu.memory_bytes:
        why = (f"its operands and output take {problem.bytes_min() / 1e9:,.1f} GB, more than the "
               f"{gpu.memory_bytes / 1e9:,.0f} GB of the {gpu.name}")
    if why is not None:
        raise ProblemTooLarge(f"{problem.key}: {why}")
