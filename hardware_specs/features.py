"""A GpuSpec as the numbers the policy reads: a fixed-scale vector and a known-GPU index.

The scales are constants, not fitted to the GPUs we know, so an unseen GPU (or an H200
slice with fewer SMs) maps to a vector on the same axes. Columns:

| column | feature | encoding |
|---|---|---|
| 0 | SM count | log2 / 8 |
| 1 | L2 bytes | log2 / 30 |
| 2, 3 | shared memory per SM, per block (bytes) | log2 / 20 |
| 4 | 32-bit registers per SM | log2 / 20 |
| 5 | max threads per SM | log2 / 12 |
| 6 | memory bandwidth GB/s | log2 / 14 |
| 7 | SM clock MHz | log2 / 12 |
| 8-12 | dense peak TFLOP/s: fp32, tf32, fp16, bf16, fp8 | log2(x + 1) / 12 |
| 13 | Tensor Core generation | / 6 |
| 14-16 | features tma, wgmma, fp8 | 0 / 1 |
| 17 | bf16 FLOP per byte of memory traffic (ridge point) | log2 / 12 |
| 18 | vendor is AMD | 0 / 1 |
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from hardware_specs.spec import DTYPES, FEATURES, GpuSpec

SPEC_DIM = 19


def spec_vector(spec: GpuSpec) -> torch.Tensor:
    """The normalised feature vector of one spec (float32, SPEC_DIM)."""
    lg = math.log2
    ridge = spec.peak("bf16") * 1e12 / (spec.memory_bandwidth_gbps * 1e9)
    values = [lg(spec.sm_count) / 8, lg(spec.l2_bytes) / 30, lg(spec.smem_per_sm_bytes) / 20,
              lg(spec.smem_per_block_bytes) / 20, lg(spec.registers_per_sm) / 20,
              lg(spec.max_threads_per_sm) / 12, lg(spec.memory_bandwidth_gbps) / 14, lg(spec.sm_clock_mhz) / 12,
              *(lg(spec.peak(d) + 1) / 12 for d in DTYPES), spec.tensor_core_generation / 6,
              *(float(spec.has(f)) for f in FEATURES), lg(max(ridge, 1.0)) / 12,
              float(spec.vendor.lower() == "amd")]
    return torch.tensor(values, dtype=torch.float32)


class GpuVocab:
    """Known GPU names to embedding indices; index 0 is 'unknown' (any other GPU)."""

    def __init__(self, names: Sequence[str]):
        self.names = tuple(sorted(set(names)))
        self._index = {n: i + 1 for i, n in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names) + 1

    def index(self, name: str) -> int:
        return self._index.get(name, 0)
