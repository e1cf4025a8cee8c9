"""Computation graphs of GEMM problems (what the GNN reads)."""
from graphs.problem import GemmProblem

__all__ = ["GemmProblem"]
