"""H200 slices: a CUDA green context restricts kernels to a subset of SMs, which makes a
smaller GPU of the same chip (same L2, memory and per-SM limits) to measure on.

`hardware_specs.load("h200-sm64")` is the spec of such a slice; `slice_stream` is where its
work runs. Contexts are kept alive for the life of the process: a stream dies with its context.

The driver rounds a requested SM count up to its partition granularity (CUDA's green-context
guide: on compute capability 9.0, a multiple of 8), so `slice_stream` counts the SMs its
kernels really reach and refuses a slice that does not have the spec's SM count.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


class SliceError(RuntimeError):
    """The green context does not give the SM count the slice's spec states."""


@triton.jit
def _sm_ids(out_ptr):
    zero = tl.zeros([1], dtype=tl.int32)
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [zero], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out_ptr + tl.program_id(0) + tl.arange(0, 1), sm)


def sms_reached(stream: torch.cuda.Stream, blocks: int = 4096) -> int:
    """How many distinct SMs `blocks` one-block-per-program kernels launched on `stream` run on."""
    out = torch.full((blocks,), -1, dtype=torch.int32, device=stream.device)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _sm_ids[(blocks,)](out)
    stream.synchronize()
    return int(out.unique().numel())


def green_stream(sm_count: int, device: int = 0) -> torch.cuda.Stream:
    """A stream of a fresh green context asked for `sm_count` SMs (the driver may grant more)."""
    from torch.cuda.green_contexts import GreenContext

    ctx = GreenContext.create(num_sms=sm_count, device_id=device)
    if not hasattr(ctx, "Stream"):
        raise RuntimeError(f"torch {torch.__version__}'s GreenContext has no Stream(); SM slices "
                           "need a torch whose green contexts hand out streams")
    stream = ctx.Stream()
    stream._green_context = ctx  # keep the context alive as long as the stream
    return stream


@functools.lru_cache(maxsize=None)
def slice_stream(sm_count: int, device: int = 0) -> torch.cuda.Stream:
    """A stream whose kernels run on exactly `sm_count` SMs of `device` (cached per size)."""
    stream = green_stream(sm_count, device)
    reached = sms_reached(stream)
    if reached != sm_count:
        raise SliceError(f"a green context of {sm_count} SMs runs kernels on {reached} SMs: the driver rounds "
                         "slices to its partition granularity; ask for a slice of that granularity")
    return stream
