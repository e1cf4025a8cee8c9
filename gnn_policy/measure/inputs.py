"""Fresh random inputs for a GemmProblem, in the layouts it names."""
from __future__ import annotations

import torch

from graphs import GemmProblem

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _matrix(batch: int, rows: int, cols: int, layout: str, dtype: torch.dtype, device,
            gen: torch.Generator | None, fill: bool) -> torch.Tensor:
    shape = (batch, rows, cols) if layout == "row" else (batch, cols, rows)
    t = torch.empty(shape, dtype=dtype, device=device)
    if fill:
        # Scaled so that C's entries are O(1) whatever K is: errors compare at a fixed scale.
        t.normal_(0.0, 1.0, generator=gen)
    t = t if layout == "row" else t.transpose(-1, -2)
    return t if batch > 1 else t[0]


def make_inputs(problem: GemmProblem, device: str | torch.device = "cuda", *, seed: int | None = None,
                fill: bool = True) -> dict[str, torch.Tensor | str | None]:
    """Keyword arguments for `gnn_policy.matmul` (a, b, bias, activation, residual).

    `fill=False` leaves the tensors uninitialised: enough to compile, never to check or time.
    """
    gen = None
    if fill and seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    dt = TORCH_DTYPES[problem.dtype]
    p = problem
    a = _matrix(p.batch, p.m, p.k, p.a_layout, dt, device, gen, fill)
    b = _matrix(p.batch, p.k, p.n, p.b_layout, dt, device, gen, fill)
    if fill:
        b.mul_(p.k ** -0.5)
    out_shape = (p.batch, p.m, p.n) if p.batch > 1 else (p.m, p.n)
    bias = residual = None
    if p.bias:
        bias = torch.empty(p.n, dtype=dt, device=device)
        if fill:
            bias.normal_(generator=gen)
    if p.residual:
        residual = torch.empty(out_shape, dtype=dt, device=device)
        if fill:
            residual.normal_(generator=gen)
    return {"a": a, "b": b, "bias": bias, "activation": p.activation, "residual": residual}
