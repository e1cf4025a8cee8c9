"""GemmProblem: one GEMM with its shapes, dtype, layouts and fused epilogue."""
from __future__ import annotations

import dataclasses

LAYOUTS = ("row", "col")
EPILOGUE_ACTIVATIONS = (None, "relu", "gelu", "silu")
DTYPES = ("fp16", "bf16", "fp32")


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """C[batch, M, N] = act(A[batch, M, K] @ B[batch, K, N] + bias[N]) + residual.

    `a_layout` / `b_layout` say which dimension is contiguous: 'row' is row-major
    (A: K contiguous, B: N contiguous), 'col' is column-major. fp32 accumulation always.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "bf16"
    a_layout: str = "row"
    b_layout: str = "row"
    bias: bool = False
    activation: str | None = None
    residual: bool = False
    model: str = ""
    layer: str = ""

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GemmProblem.{name} must be an int >= 1, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"GemmProblem.dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("a_layout", "b_layout"):
            if getattr(self, name) not in LAYOUTS:
                raise ValueError(f"GemmProblem.{name} must be one of {LAYOUTS}, got {getattr(self, name)!r}")
        if self.activation not in EPILOGUE_ACTIVATIONS:
            raise ValueError(f"GemmProblem.activation must be one of {EPILOGUE_ACTIVATIONS}")

    @property
    def key(self) -> str:
        """Stable key of the computation (model and layer are provenance, not part of it)."""
        epi = "".join(["b" if self.bias else "", self.activation or "", "r" if self.residual else ""])
        return (f"{self.batch}x{self.m}x{self.n}x{self.k}_{self.dtype}_{self.a_layout[0]}"
                f"{self.b_layout[0]}" + (f"_{epi}" if epi else ""))

    @property
    def flops(self) -> int:
        """2·M·N·K per batch: the multiply-adds (the epilogue's element-wise work is not counted)."""
        return 2 * self.batch * self.m * self.n * self.k

    def bytes_min(self) -> int:
        """Fewest bytes a kernel must move: each input read once, the output written once."""
        esize = 4 if self.dtype == "fp32" else 2
        elems = self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)
        elems += self.n if self.bias else 0
        elems += self.batch * self.m * self.n if self.residual else 0
        return esize * elems
