"""The torch reference for the template, and the tolerance each dtype is held to."""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Relative Frobenius error ||out - ref|| / ||ref|| against a float64 reference.
# fp16/bf16: inputs are exact, the output cast costs ~2^-9 / 2^-8 per element; fp32 runs through
# tf32 on the GPU (10-bit mantissa operands), about 3e-4 on random data.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 2e-3}


def reference(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
              activation: str | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """act(A @ B + bias) + residual in float64, on the inputs' device."""
    out = torch.matmul(a.double(), b.double())
    if bias is not None:
        out = out + bias.double()
    if activation == "relu":
        out = F.relu(out)
    elif activation == "gelu":
        out = F.gelu(out)
    elif activation == "silu":
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    if residual is not None:
        out = out + residual.double()
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F; inf when out has a NaN or Inf that ref lacks."""
    out64 = out.double()
    if not torch.isfinite(out64).all() and torch.isfinite(ref).all():
        return float("inf")
    denom = torch.linalg.vector_norm(ref).item()
    diff = torch.linalg.vector_norm(out64 - ref).item()
    return diff / denom if denom > 0 else diff
