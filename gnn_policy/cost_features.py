"""What the cost model reads of a (problem, GPU, config) besides the encodings, as tensors.

- `problem_vector`: the numbers of one (problem, GPU) the features need, and the log of its
  roofline (`calibration.roofline_tflops`), the bound of the roofline-bounded cost head.
- `config_values`: each point of a space as numbers (tile sizes, warps, stages, variant).
- `analytic_features`: how a config covers a problem on a GPU, for any broadcastable batch
  of both: waves and tiles per SM, padding in M, N and K, K iterations (`tile_geometry`),
  the bytes per access each operand loads as laid out (TMA boxes, or vectors of pointer
  loads), shared memory per stage and occupancy (the resource model of `gnn_policy.space`),
  the tile's arithmetic intensity against the GPU's balance, split-K's partial traffic, the
  variant and the epilogue. They are ratios of integers an MLP over embeddings can only
  approximate, and they decide the ranking of near-equal configs.
"""
from __future__ import annotations

import functools
import math

import torch

from graphs import GemmProblem
from hardware_specs import GpuSpec
from gnn_policy.calibration import roofline_tflops
from gnn_policy.space import (DTYPE_BYTES, TMA_VARIANTS, ConfigSpace, accumulators_per_thread, leading_dims,
                              pipeline_smem, resident_programs)

# The first five are `problem_dims`, what the tile geometry reads (and all the first cost head read).
PROBLEM_FIELDS = ("batch", "m", "n", "k", "sm_count", "elem_bytes", "a_lead", "b_lead", "c_lead", "a_col", "b_col",
                  "bias", "activation", "residual", "bytes", "smem_per_sm", "threads_per_sm", "balance",
                  "log_roofline", "log_peak")
PROBLEM_DIM = len(PROBLEM_FIELDS)
CONFIG_FIELDS = ("block_m", "block_n", "block_k", "split_k", "group_m", "num_warps", "num_stages", "tma", "warpspec")
GEOMETRY_DIM = 7
FEATURE_DIM = GEOMETRY_DIM + 19
VECTOR_BYTES = 16  # the widest load or store one thread issues (128 bits), and TMA's stride alignment


def problem_dims(problem: GemmProblem, gpu: GpuSpec) -> torch.Tensor:
    """[5]: batch, M, N, K and the GPU's SM count, what `tile_geometry` needs of a (problem, GPU)."""
    return torch.tensor([problem.batch, problem.m, problem.n, problem.k, gpu.sm_count], dtype=torch.float64)


def problem_vector(problem: GemmProblem, gpu: GpuSpec) -> torch.Tensor:
    """[PROBLEM_DIM] float64, fields in `PROBLEM_FIELDS` order."""
    a_lead, b_lead = leading_dims(problem)
    peak = gpu.peak("tf32" if problem.dtype == "fp32" else problem.dtype)
    values = [problem.batch, problem.m, problem.n, problem.k, gpu.sm_count, DTYPE_BYTES[problem.dtype],
              a_lead, b_lead, problem.n, problem.a_layout == "col", problem.b_layout == "col", problem.bias,
              problem.activation is not None, problem.residual, problem.bytes_min(), gpu.smem_per_sm_bytes,
              gpu.max_threads_per_sm, peak * 1e12 / (gpu.memory_bandwidth_gbps * 1e9),
              math.log(roofline_tflops(problem, gpu)), math.log(peak)]
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


@functools.lru_cache(maxsize=4)
def config_values(space_: ConfigSpace) -> torch.Tensor:
    """[len(space), CONFIG_DIM] float64 (exact): every point in grid order, fields in `CONFIG_FIELDS` order."""
    return torch.tensor([[c.block_m, c.block_n, c.block_k, c.split_k, c.group_m, c.num_warps, c.num_stages,
                          c.variant in TMA_VARIANTS, c.variant == "warpspec"] for c in space_], dtype=torch.float64)


@functools.lru_cache(maxsize=4)
def feature_points(space_: ConfigSpace) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct rows [U, CONFIG_DIM] float32, row of each point [len(space)]): the points told
    apart by what `analytic_features` reads. It does not read GROUP_M (an L2 swizzle whose
    effect the knob's embedding carries), so a problem's features take a quarter of the work."""
    values = config_values(space_).clone()
    values[:, CONFIG_FIELDS.index("group_m")] = 0
    rows, inverse = torch.unique(values, dim=0, return_inverse=True)
    return rows.float(), inverse


def tile_geometry(tiles: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """[..., GEOMETRY_DIM] for tile sizes [..., 4] (block_m, block_n, block_k, split_k) and
    `problem_dims` [..., 5] broadcast against them:
    log2 of tiles per SM, the wave efficiency tiles / (waves x SMs), M and N coverage by the
    tiles (padding waste), log2 of K iterations per tile, the coverage of K by them, and
    log2 of split_k. A tile is one program of the launch grid; several may share an SM.
    """
    bm, bn, bk, sk = tiles.unbind(-1)
    batch, m, n, k, sms = dims.unbind(-1)
    count = batch * torch.ceil(m / bm) * torch.ceil(n / bn) * sk
    waves = torch.ceil(count / sms)
    k_per_split = torch.ceil(k / sk)
    k_iters = torch.ceil(k_per_split / bk)
    feats = [torch.log2(count / sms), count / (waves * sms), m / (torch.ceil(m / bm) * bm),
             n / (torch.ceil(n / bn) * bn), torch.log2(k_iters), k_per_split / (k_iters * bk), torch.log2(sk)]
    return torch.stack(feats, -1)


def _access_bytes(lead: torch.Tensor, elem: torch.Tensor, tma: torch.Tensor) -> torch.Tensor:
    """Bytes one access moves: a TMA box row is 16-byte aligned (the mask rules TMA out where
    it is not); pointer loads vectorise only when Triton can prove the stride divisible by 16
    elements, else they fall back to one element per access (README: rows of 1000 elements)."""
    vector = torch.where(torch.remainder(lead, 16) == 0, torch.full_like(lead, VECTOR_BYTES), elem)
    return torch.where(tma > 0, torch.full_like(lead, VECTOR_BYTES), vector)


def analytic_features(values: torch.Tensor, problem: torch.Tensor) -> torch.Tensor:
    """[..., FEATURE_DIM] for configs [..., CONFIG_DIM] (`config_values`) and problems
    [..., PROBLEM_DIM] (`problem_vector`) broadcast against them; logs are scaled to about
    unit range, so that no feature dominates the first layer."""
    bm, bn, bk, sk, _, warps, stages, tma, warpspec = values.unbind(-1)
    p = dict(zip(PROBLEM_FIELDS, problem.unbind(-1)))
    geometry = tile_geometry(torch.stack([bm, bn, bk, sk], -1), problem[..., :5])
    count = p["batch"] * torch.ceil(p["m"] / bm) * torch.ceil(p["n"] / bn) * sk
    stage = pipeline_smem(bm, bn, bk, 1, p["elem_bytes"])
    resident = resident_programs(stage * stages, warps, p["smem_per_sm"], p["threads_per_sm"]).to(values)
    active = torch.minimum(resident, torch.ceil(count / p["sm_count"]))
    acc = accumulators_per_thread(bm, bn, warps, warpspec)
    intensity = 2 * bm * bn / ((bm + bn) * p["elem_bytes"])  # FLOPs per byte a K step loads
    partials = (sk > 1) * sk * 4 * p["batch"] * p["m"] * p["n"] / p["bytes"]  # fp32 split-K traffic / minimum
    ones = torch.ones_like(bm)
    feats = [
        torch.log2(_access_bytes(p["a_lead"] * ones, p["elem_bytes"] * ones, tma)) / 4,
        torch.log2(_access_bytes(p["b_lead"] * ones, p["elem_bytes"] * ones, tma)) / 4,
        torch.log2(_access_bytes(p["c_lead"] * ones, p["elem_bytes"] * ones, 0 * tma)) / 4,
        (torch.log2(stage) - 14) / 2, stage * stages / p["smem_per_sm"],
        torch.log2(resident) / 2, resident * warps * 32 / p["threads_per_sm"],
        active * warps * 32 / p["threads_per_sm"], acc / 128,
        torch.log2(intensity / p["balance"]) / 2, torch.log1p(partials),
        tma, warpspec, p["bias"] * ones, p["activation"] * ones, p["residual"] * ones,
        (p["log_roofline"] - p["log_peak"]) * ones, p["a_col"] * ones, p["b_col"] * ones,
    ]
    return torch.cat([geometry, torch.stack(feats, -1)], -1)
