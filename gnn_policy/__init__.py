"""gnn-policy: a learned autotuner for Triton GEMM kernels.

`matmul` is imported lazily: importing it runs Triton's @jit decorators, which must see
TRITON_INTERPRET (for CPU-only machines) before they run; `gnn_policy.cli` sets it first.
"""
from typing import Any

from gnn_policy.checkpoint import CheckpointError
from gnn_policy.space import ConfigSpace, TileConfig, Violation, named_list, space, violations

__all__ = ["CheckpointError", "ConfigSpace", "InvalidConfigError", "TileConfig", "Violation", "matmul",
           "named_list", "space", "violations"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("matmul", "InvalidConfigError"):
        from gnn_policy import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'gnn_policy' has no attribute {name!r}")
