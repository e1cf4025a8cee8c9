"""gnn-policy: a learned autotuner for Triton GEMM kernels."""
from gnn_policy.ops import InvalidConfigError, matmul
from gnn_policy.space import ConfigSpace, TileConfig, named_list, space, violations

__all__ = ["ConfigSpace", "InvalidConfigError", "TileConfig", "matmul", "named_list", "space",
           "violations"]
__version__ = "0.1.0"
