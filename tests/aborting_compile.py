"""A compile function for pool tests: aborts its process for BLOCK_M 16, as a failed
assertion inside Triton's compiler does."""
import os

from gnn_policy.measure.compile import CompileResult


def compile_or_abort(job):
    problem, config, _ = job
    if config.block_m == 16:
        os.abort()
    return CompileResult(problem.key, config.key, "ok", 0.0)
