"""gnn-policy: a learned autotuner for Triton GEMM kernels.

`matmul`, `patch` and `unpatch` are imported lazily: importing them runs Triton's @jit
decorators, which must see TRITON_INTERPRET (for CPU-only machines) before they run;
`gnn_policy.cli` sets it first.
"""
from typing import Any

from gnn_policy.checkpoint import CheckpointError
from gnn_policy.space import ConfigSpace, TileConfig, Violation, named_list, space, violations

__all__ = ["CheckpointError", "ConfigSpace", "InvalidConfigError", "TileConfig", "Violation", "matmul",
           "named_list", "patch", "space", "unpatch", "violations"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("matmul", "InvalidConfigError"):
        from gnn_policy import ops

        return getattr(ops, name)
    if name in ("patch", "unpatch"):
        from gnn_policy import patching  # not gnn_policy/patch.py: the submodule would shadow the function

        return getattr(patching, name)
    raise AttributeError(f"module 'gnn_policy' has no attribute {name!r}")
