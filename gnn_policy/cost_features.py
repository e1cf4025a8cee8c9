"""What the cost model reads of a (problem, GPU, config) besides the encodings, as tensors.

- `problem_vector`: the numbers of one (problem, GPU) the features need, and the log of its
  roofline (`calibration.roofline_tflops`), the bound of the roofline-bounded cost head. It is
  the roofline of the work alone, without the GPU's launch floor: the shipped checkpoints were
  trained on it, so their efficiencies already carry the floor's share of a small problem's
  time, and adding the floor under them (bound and feature) counts it twice: the median
  |log error| of their favourites' TFLOP/s went from 0.149 to 0.285 on the training problems
  (0.201 to 0.226 on val). The floor bounds the figures a user sees (`calibration.calibrated`).
  `log_bound` is the log of the roofline with the floor: a model trained with
  `ModelConfig.floored_bound` reads it in place of `log_roofline`, as its bound and its feature.
- `config_values`: each point of a space as numbers (tile sizes, warps, stages, variant).
- `analytic_features`: how a config covers a problem on a GPU, for any broadcastable batch
  of both: waves and tiles per SM, padding in M, N and K, K iterations (`tile_geometry`),
  the bytes per access each operand loads as laid out (TMA boxes, or vectors of pointer
  loads), shared memory per stage and occupancy (the resource model of `gnn_policy.space`),
  the tile's arithmetic intensity against the GPU's balance, split-K's partial traffic, the
  variant and the epilogue. They are ratios of integers an MLP over embeddings can only
  approximate, and they decide the ranking of near-equal configs. They are computed in
  groups by what they read (`FEATURE_COLUMNS`), so that `gnn_policy.scoring` computes each
  group once per tile shape, variant, GPU or problem rather than once per config.
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
                  "log_roofline", "log_peak", "log_bound")
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
              math.log(roofline_tflops(problem, gpu, floor=False)), math.log(peak),
              math.log(roofline_tflops(problem, gpu, floor=True))]
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


@functools.lru_cache(maxsize=4)
def config_values(space_: ConfigSpace) -> torch.Tensor:
    """[len(space), CONFIG_DIM] float64 (exact): every point in grid order, fields in `CONFIG_FIELDS` order."""
    return torch.tensor([[c.block_m, c.block_n, c.block_k, c.split_k, c.group_m, c.num_warps, c.num_stages,
                          c.variant in TMA_VARIANTS, c.variant == "warpspec"] for c in space_], dtype=torch.float64)


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


# The features in groups by what they read, so that `scoring` computes each group where it
# varies: per tile shape, per variant, per GPU and dtype, per problem. Columns: where each
# group's features sit among the FEATURE_DIM, the order the trained weights read.
FEATURE_COLUMNS = {
    "tile": (0, 1, 2, 3, 4, 5, 6, 17),  # `tile_features`: block_m, block_n, block_k, split_k and the problem
    "access": (7, 8),  # `access_features`: TMA or not, and the problem's strides
    "resources": (10, 11, 12, 13, 15, 16, 18, 19),  # `resource_features`: the config, the GPU and the dtype
    "occupancy": (14,),  # `occupancy_feature`: the config and the problem
    "problem": (9, 20, 21, 22, 23, 24, 25),  # `problem_features`: the problem alone
}
# The problem fields `resource_features` reads: a (GPU, dtype)'s, the same for all its problems
RESOURCE_FIELDS = ("elem_bytes", "smem_per_sm", "threads_per_sm", "balance")


def _fields(problem: torch.Tensor) -> dict[str, torch.Tensor]:
    return dict(zip(PROBLEM_FIELDS, problem.unbind(-1)))


def tile_features(tiles: torch.Tensor, problem: torch.Tensor) -> torch.Tensor:
    """[..., 8] for tile sizes [..., 4] (as `tile_geometry`) and `problem_vector`s [..., PROBLEM_DIM]:
    the tile geometry and log1p of split-K's fp32 partial traffic over the problem's minimum."""
    p, sk = _fields(problem), tiles[..., 3]
    partials = (sk > 1) * sk * 4 * p["batch"] * p["m"] * p["n"] / p["bytes"]
    return torch.cat([tile_geometry(tiles, problem[..., :5]), torch.log1p(partials)[..., None]], -1)


def access_features(tma: torch.Tensor, problem: torch.Tensor) -> torch.Tensor:
    """[..., 2]: log2 of the bytes per access of A and B as laid out, / 4, for TMA flags [...]."""
    p, ones = _fields(problem), torch.ones_like(tma)
    return torch.stack([torch.log2(_access_bytes(p[lead] * ones, p["elem_bytes"] * ones, tma)) / 4
                        for lead in ("a_lead", "b_lead")], -1)


def _resident(values: torch.Tensor, p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(shared memory per stage, programs one SM holds) of configs under the space's resource model."""
    bm, bn, bk, _, _, warps, stages, _, _ = values.unbind(-1)
    stage = pipeline_smem(bm, bn, bk, 1, p["elem_bytes"])
    return stage, resident_programs(stage * stages, warps, p["smem_per_sm"], p["threads_per_sm"]).to(values)


def resource_features(values: torch.Tensor, problem: torch.Tensor) -> torch.Tensor:
    """[..., 8] of configs [..., CONFIG_DIM]; reads only the problem's `RESOURCE_FIELDS`: shared
    memory per stage and in all, programs resident per SM and their share of its threads,
    accumulators per thread, the tile's arithmetic intensity against the GPU's balance, the variant."""
    bm, bn, _, _, _, warps, stages, tma, warpspec = values.unbind(-1)
    p = _fields(problem)
    stage, resident = _resident(values, p)
    acc = accumulators_per_thread(bm, bn, warps, warpspec)
    intensity = 2 * bm * bn / ((bm + bn) * p["elem_bytes"])  # FLOPs per byte a K step loads
    return torch.stack([(torch.log2(stage) - 14) / 2, stage * stages / p["smem_per_sm"], torch.log2(resident) / 2,
                        resident * warps * 32 / p["threads_per_sm"], acc / 128,
                        torch.log2(intensity / p["balance"]) / 2, tma, warpspec], -1)


def occupancy_feature(values: torch.Tensor, problem: torch.Tensor) -> torch.Tensor:
    """[...]: the share of an SM's threads the problem's tiles keep busy (resident programs,
    or fewer when the grid has fewer tiles per SM)."""
    bm, bn, _, sk, _, warps, _, _, _ = values.unbind(-1)
    p = _fields(problem)
    count = p["batch"] * torch.ceil(p["m"] / bm) * torch.ceil(p["n"] / bn) * sk
    active = torch.minimum(_resident(values, p)[1], torch.ceil(count / p["sm_count"]))
    return active * warps * 32 / p["threads_per_sm"]


def problem_features(problem: torch.Tensor) -> torch.Tensor:
    """[..., 7]: the width of C's stores, the epilogue, how far the roofline is below the peak
    (memory bound), and the layouts of A and B."""
    p = _fields(problem)
    c_width = torch.log2(_access_bytes(p["c_lead"], p["elem_bytes"], torch.zeros_like(p["c_lead"]))) / 4
    return torch.stack([c_width, p["bias"], p["activation"], p["residual"], p["log_roofline"] - p["log_peak"],
                        p["a_col"], p["b_col"]], -1)


def analytic_features(values: torch.Tensor, problem: torch.Tensor) -> torch.Tensor:
    """[..., FEATURE_DIM] for configs [..., CONFIG_DIM] (`config_values`) and problems
    [..., PROBLEM_DIM] (`problem_vector`) broadcast against them; logs are scaled to about
    unit range, so that no feature dominates the first layer."""
    groups = {"tile": tile_features(values[..., :4], problem),
              "access": access_features(values[..., CONFIG_FIELDS.index("tma")], problem),
              "resources": resource_features(values, problem),
              "occupancy": occupancy_feature(values, problem)[..., None], "problem": problem_features(problem)}
    shape = torch.broadcast_shapes(values.shape[:-1], problem.shape[:-1])
    out = values.new_empty(*shape, FEATURE_DIM, dtype=torch.promote_types(values.dtype, problem.dtype))
    for name, columns in FEATURE_COLUMNS.items():
        out[..., list(columns)] = groups[name]
    return out
