"""GemmProblem: one GEMM with its shapes, dtype, layouts and fused epilogue."""
from __future__ import annotations

import dataclasses
import re

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

    @classmethod
    def from_key(cls, key: str) -> GemmProblem:
        """The computation a `key` names (model and layer are not in a key, so they stay empty)."""
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)_([a-z0-9]+)_([rc])([rc])(?:_(b?)(relu|gelu|silu)?(r?))?", key)
        if not m:
            raise ValueError(f"not a GemmProblem key: {key!r} (expected e.g. 1x16x4096x4096_bf16_rr_bgelu)")
        batch, m_, n, k = (int(x) for x in m.group(1, 2, 3, 4))
        layout = {"r": "row", "c": "col"}
        problem = cls(m=m_, n=n, k=k, batch=batch, dtype=m.group(5), a_layout=layout[m.group(6)],
                      b_layout=layout[m.group(7)], bias=m.group(8) == "b", activation=m.group(9),
                      residual=m.group(10) == "r")
        if problem.key != key:  # e.g. an empty epilogue suffix: one computation has one key
            raise ValueError(f"not a GemmProblem key: {key!r} (this computation's key is {problem.key!r})")
        return problem

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
