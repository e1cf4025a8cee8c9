"""H200 slices: a CUDA green context restricts kernels to a subset of SMs, which makes a
smaller GPU of the same chip (same L2, memory and per-SM limits) to measure on.

`hardware_specs.load("h200-sm66")` is the spec of such a slice; `slice_stream` is where its
work runs. Contexts are kept alive for the life of the process: a stream dies with its context.
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def slice_stream(sm_count: int, device: int = 0) -> torch.cuda.Stream:
    """A stream whose kernels run on `sm_count` SMs of `device` (cached per size)."""
    from torch.cuda.green_contexts import GreenContext

    ctx = GreenContext.create(num_sms=sm_count, device_id=device)
    if not hasattr(ctx, "Stream"):
        raise RuntimeError(f"torch {torch.__version__}'s GreenContext has no Stream(); SM slices "
                           "need a torch whose green contexts hand out streams")
    stream = ctx.Stream()
    stream._green_context = ctx  # keep the context alive as long as the stream
    return stream
