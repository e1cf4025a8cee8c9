"""The tiling config space: the validity rules, `ConfigSpace` and the named baseline lists.

This module is the one definition of every knob, its values and the rules that make a
config invalid on a GPU. The policy's action heads, every search and every baseline derive
from it, so a rule added here applies everywhere at once. `TileConfig` (one point, in
`gnn_policy.tile_config`) is imported from here like the rest.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
from typing import Any, Iterator

from hardware_specs import GpuSpec
from gnn_policy.tile_config import (DTYPE_BYTES, PERSISTENT_VARIANTS, TMA_VARIANTS, VARIANTS,  # noqa: F401
                                    TileConfig, accumulators_per_thread, pipeline_smem)

# Rules that refuse a variant until a GPU trial shows it runs: `GNN_POLICY_LIFT_RULES=warpspec-sm90`
# lifts them for that trial (a newer Triton's; the GPU test's worker processes read it), and
# for nothing else.
LIFTABLE_RULES = frozenset({"warpspec-sm90"})


def lifted_rules(text: str) -> frozenset[str]:
    """The rules named in GNN_POLICY_LIFT_RULES (comma-separated); a rule not in LIFTABLE_RULES is an error."""
    names = frozenset(filter(None, (x.strip() for x in text.split(","))))
    if names - LIFTABLE_RULES:
        raise ValueError(f"GNN_POLICY_LIFT_RULES: {', '.join(sorted(names - LIFTABLE_RULES))} cannot be lifted; "
                         f"only {', '.join(sorted(LIFTABLE_RULES))} (rules awaiting a GPU trial)")
    return names


LIFTED_RULES = lifted_rules(os.environ.get("GNN_POLICY_LIFT_RULES", ""))

# The accumulator lives in registers: past this many fp32 values per thread ptxas spills.
# Measured on the H200 (triton 3.6, bf16): every config with more spilled, none with fewer.
MAX_ACC_PER_THREAD = 128


def resident_programs(smem_bytes: Any, warps: Any, smem_per_sm: Any, threads_per_sm: Any) -> Any:
    """Programs one SM holds at once as far as shared memory and threads allow (the `registers`
    rule bounds the rest), at least 1; ints, or tensors of configs. CUDA reserves 1 KB of shared
    memory per block."""
    by_smem = smem_per_sm // (smem_bytes + 1024)
    by_threads = threads_per_sm // (32 * warps)
    if isinstance(by_smem, int):
        return max(1, min(by_smem, by_threads))
    return by_smem.minimum(by_threads).clamp(min=1)  # tensors of configs


@dataclasses.dataclass(frozen=True)
class Violation:
    """A broken validity rule: `rule` is a short stable name, `message` says why."""

    rule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


def violations(config: TileConfig, gpu: GpuSpec, dtype: str, k: int | None = None) -> list[Violation]:
    """Every rule `config` breaks on `gpu` for inputs of `dtype` (and reduction length `k`)."""
    out: list[Violation] = []
    if dtype not in DTYPE_BYTES:
        return [Violation("dtype", f"dtype {dtype!r} is not supported; use one of {sorted(DTYPE_BYTES)}")]
    peak_key = "tf32" if dtype == "fp32" else dtype
    if gpu.peak(peak_key) <= 0:
        out.append(Violation("dtype", f"{gpu.name} has no {peak_key} tensor-core support"))
    smem = config.smem_bytes(dtype)
    if smem > gpu.smem_per_block_bytes:
        out.append(Violation("smem", f"needs {smem} bytes of shared memory per block "
                             f"({config.num_stages} stages), {gpu.name} allows {gpu.smem_per_block_bytes}"))
    acc = config.acc_per_thread()
    if acc > MAX_ACC_PER_THREAD or (acc == MAX_ACC_PER_THREAD and config.num_warps == 2):
        out.append(Violation("registers", f"{acc:g} fp32 accumulators per thread with "
                             f"{config.num_warps} warps spill registers (limit {MAX_ACC_PER_THREAD})"))
    if acc < 2:
        out.append(Violation("warps", f"{config.num_warps} warps for a {config.block_m}x{config.block_n} "
                             f"tile leave threads without accumulators; use fewer warps"))
    if config.variant in TMA_VARIANTS and not gpu.has("tma"):
        out.append(Violation("tma", f"{gpu.name} has no Tensor Memory Accelerator"))
    out += _persistent_violations(config, gpu, dtype)
    if k is not None and not fits_k(config, k):
        out.append(Violation("split_k", f"SPLIT_K={config.split_k} exceeds the "
                             f"{math.ceil(k / config.block_k)} BLOCK_K={config.block_k} tiles of K={k}"))
    return [v for v in out if v.rule not in LIFTED_RULES]


def _persistent_violations(config: TileConfig, gpu: GpuSpec, dtype: str) -> list[Violation]:
    """Rules of the persistent variants, from compiling them for sm_90 (triton 3.6)."""
    out: list[Violation] = []
    if config.variant == "warpspec":
        # On Hopper (docs/BENCHMARKS.md, "Warp specialisation on Hopper" and "The warpspec trial"):
        # it hung with host-side tensor maps, whose box Triton 3.6 kept when it halved the copies
        # for two consumers. With the maps made in the kernel, the GPU trial of 2026-12-07 (H100,
        # 160 random cases) had no hang but 16 wrong results: BLOCK_M >= 128 with 5+ stages and
        # 4+ K iterations, and BLOCK_M 256 at K = 1; one out of shared memory past this file's
        # estimate. Triton's own warp-specialised forms were no faster than the template's best
        # config on any of 5 shapes (benchmarks.warpspec_probe). Refused until a Triton fixes it.
        if gpu.compute_capability.startswith("9."):
            out.append(Violation("warpspec-sm90", "Triton 3.6's warp specialisation gives wrong results for "
                                 "this template on Hopper (sm_90) at BLOCK_M >= 128 with 5+ stages, and "
                                 "was no faster where right; the persistent variant runs the same loop"))
        # Triton's Hopper pass specialises only 4-warp kernels whose tile splits into two
        # 64-row halves; others compile unspecialised, i.e. as the `persistent` variant.
        if config.num_warps != 4:
            out.append(Violation("warpspec", f"warp specialisation needs num_warps=4 (got {config.num_warps}); "
                                 "Triton leaves other kernels unspecialised"))
        if config.block_m < 64:
            out.append(Violation("warpspec", f"warp specialisation needs BLOCK_M >= 64 (got {config.block_m})"))
        # Triton 3.6 splits a 64-row tile between the consumers along N, and aborts on a
        # 64x256 tile (assertion in MMAHelpers.h, "Instruction shape is too large for the
        # layout"; on the H200 and in a CPU compile for sm_90).
        if config.block_m == 64 and config.block_n == 256:
            out.append(Violation("warpspec", "Triton's compiler aborts on a warp-specialised 64x256 tile"))
        # Compiled for the H200 (benchmarks.resources, 2026-12-04): with split-K, 6 of 16
        # accepted configs spilled (up to 128 registers) and one did not compile.
        if config.split_k > 1:
            out.append(Violation("warpspec", "warp specialisation runs SPLIT_K=1 only; the persistent "
                                 "and tma variants split K"))
        # Compiled for sm_90 on the CPU (2026-12-05): of 64 fp32 cases of the GPU test, 33
        # failed in Triton's ConvertNVGPUToLLVM pass (every layout but K-major A and B, and
        # some of those); all 154 fp16 / bf16 cases compiled.
        # A precaution, not a measurement: the GPU test's warpspec cases ran past their limit
        # twice without a result, and one-stage warp-specialised loops hung in Triton's
        # earlier Hopper warp specialisation (triton-lang/triton#2868). Lift it once a GPU
        # run of one-stage cases in a subprocess with a timeout shows they finish.
        if config.num_stages < 2:
            out.append(Violation("warpspec", "warp specialisation needs num_stages >= 2 (a producer "
                                 "and its consumers share at least two buffers)"))
        if dtype == "fp32":
            out.append(Violation("warpspec", "warp specialisation runs fp16 and bf16 only; Triton 3.6 "
                                 "does not compile most fp32 warp-specialised dots"))
    if config.variant == "streamk" and config.split_k > 1:
        out.append(Violation("streamk", f"stream-K cuts K itself; SPLIT_K={config.split_k} must be 1"))
    if config.variant in PERSISTENT_VARIANTS:
        pipeline = config.smem_bytes(dtype)
        tile = config.block_m * config.block_n
        # Besides the pipeline: the output tile staged for the TMA store (kept apart, since
        # the next tile's loads are in flight meanwhile), the fp32 split-K partial staged for
        # its store, and the barriers.
        staged = {"persistent": tile, "subtile": tile // 2, "streamk": tile}.get(config.variant, 0) * DTYPE_BYTES[dtype]
        extra = staged + tile * 4 * (config.split_k > 1) + 1024
        if pipeline <= gpu.smem_per_block_bytes < pipeline + extra:
            out.append(Violation("smem", f"needs {pipeline + extra} bytes of shared memory per block "
                                 f"(pipeline {pipeline}, epilogue {extra}), {gpu.name} allows "
                                 f"{gpu.smem_per_block_bytes}"))
    return out


def fits_k(config: TileConfig, k: int) -> bool:
    """The one problem-dependent rule: SPLIT_K at most the BLOCK_K tiles of K.

    Slices take ceil(tiles / SPLIT_K) tiles each, so trailing slices can still be empty.
    """
    return config.split_k <= math.ceil(k / config.block_k)


@dataclasses.dataclass(frozen=True)
class ConfigSpace:
    """A named grid of knob values; iterate it for every point, filter with `valid`."""

    name: str
    knobs: tuple[tuple[str, tuple[Any, ...]], ...]

    @property
    def values(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.knobs)

    @property
    def points(self) -> tuple[TileConfig, ...]:
        """Every point in grid order (the order of `mask`'s flattened entries), built once."""
        return _points(self)

    def __iter__(self) -> Iterator[TileConfig]:
        return iter(self.points)

    def __len__(self) -> int:
        return math.prod(len(v) for _, v in self.knobs)

    def __contains__(self, config: object) -> bool:
        if not isinstance(config, TileConfig):
            return False
        return all(getattr(config, n) in v for n, v in self.knobs)

    def valid(self, gpu: GpuSpec, dtype: str, k: int | None = None) -> list[TileConfig]:
        return [c for c in self if not violations(c, gpu, dtype, k)]

    @property
    def shape(self) -> tuple[int, ...]:
        """Values per knob, in knob order: the shape of `mask` (and of the policy's heads)."""
        return tuple(len(v) for _, v in self.knobs)

    def index(self, config: TileConfig) -> tuple[int, ...]:
        """Each knob's value index; raises ValueError for a config outside the space."""
        try:
            return tuple(v.index(getattr(config, n)) for n, v in self.knobs)
        except ValueError:
            raise ValueError(f"{config.key} is not in the {self.name!r} space") from None

    def flat_index(self, config: TileConfig) -> int:
        """`config`'s position in `points` and in `mask`'s flattened entries."""
        flat = 0
        for i, size in zip(self.index(config), self.shape):
            flat = flat * size + i
        return flat

    def at(self, index: tuple[int, ...]) -> TileConfig:
        return TileConfig(**{n: v[i] for (n, v), i in zip(self.knobs, index)})

    def mask(self, gpu: GpuSpec, dtype: str, k: int | None = None) -> Any:
        """A bool tensor of `shape`: True where the config is valid (`violations` is empty)."""
        import torch

        base = _base_mask(self, gpu, dtype)
        if k is None:
            return base.clone()  # the cached tensor stays untouched by callers
        names = [n for n, _ in self.knobs]
        bk, sk = names.index("block_k"), names.index("split_k")
        fits = torch.tensor([[s <= math.ceil(k / b) for s in self.values["split_k"]]
                             for b in self.values["block_k"]])  # [block_k, split_k]
        view = [1] * len(names)
        view[bk], view[sk] = len(self.values["block_k"]), len(self.values["split_k"])
        return base & (fits if bk < sk else fits.T).reshape(view)

    def problem_mask(self, gpu: GpuSpec, problem: Any) -> Any:
        """`mask` for one GemmProblem, with TMA ruled out where its operands' strides forbid it."""
        out = self.mask(gpu, problem.dtype, problem.k)
        if not tma_fits(problem) and "variant" in self.values:
            names = [n for n, _ in self.knobs]
            index = [slice(None)] * len(names)
            for variant in TMA_VARIANTS:
                if variant in self.values["variant"]:
                    index[names.index("variant")] = self.values["variant"].index(variant)
                    out[tuple(index)] = False
        return out


def leading_dims(problem: Any) -> tuple[int, int]:
    """Elements between consecutive rows (row-major) or columns (column-major) of A and B as stored."""
    a_rows = problem.k if problem.a_layout == "row" else problem.m
    b_rows = problem.n if problem.b_layout == "row" else problem.k
    return a_rows, b_rows


def tma_fits(problem: Any) -> bool:
    """TMA loads need 16-byte aligned row strides of A and B as stored (else `tma-alignment`)."""
    e = DTYPE_BYTES[problem.dtype]
    return all((rows * e) % 16 == 0 for rows in leading_dims(problem))


@functools.lru_cache(maxsize=8)
def _points(space_: ConfigSpace) -> tuple[TileConfig, ...]:
    """Searches walk the 90,000-point space once per problem: build its points once."""
    names = [n for n, _ in space_.knobs]
    return tuple(TileConfig(**dict(zip(names, combo))) for combo in itertools.product(*(v for _, v in space_.knobs)))


@functools.lru_cache(maxsize=64)
def _base_mask(space_: ConfigSpace, gpu: GpuSpec, dtype: str) -> Any:
    import torch

    return torch.tensor([not violations(c, gpu, dtype) for c in space_]).reshape(space_.shape)


def _space(name: str, **knobs: tuple[Any, ...]) -> ConfigSpace:
    return ConfigSpace(name, tuple(knobs.items()))


_TILES = dict(block_m=(16, 32, 64, 128, 256), block_n=(16, 32, 64, 128, 256),
              block_k=(16, 32, 64, 128, 256), split_k=(1, 2, 4, 8, 16), group_m=(1, 4, 8, 16),
              num_warps=(2, 4, 8), num_stages=(1, 2, 3, 4, 5, 6))

SPACES: dict[str, ConfigSpace] = {
    # DESIGN.md's Hopper target space with the two one-program-per-tile variants: the space of
    # the shipped checkpoints, kept as it was so that they load and rank unchanged.
    "full": _space("full", **_TILES, variant=("ptr", "tma")),
    # The same knobs with the four variants of 2026-12-05: the space of pretrained-broad.pt.
    "hopper": _space("hopper", **_TILES, variant=("ptr", "tma", "persistent", "warpspec")),
    # The same knobs with every variant of the template.
    "hopper-all": _space("hopper-all", **_TILES, variant=VARIANTS),
    # The variants to collect: those that passed the GPU correctness suite (`warpspec` hangs on
    # Hopper). `streamk` passed too (2026-12-06, H100) but was never the best variant of a
    # ceiling shape (0.50-1.05x cuBLAS): kept out until a profile says why its runs are slow.
    "hopper-tested": _space("hopper-tested", **_TILES, variant=("ptr", "tma", "persistent", "subtile")),
    # The seed project's space: 96 points; its warps and stages were Triton's defaults (4, 3).
    "seed": _space("seed", block_m=(16, 32, 64, 128), block_n=(16, 32, 64, 128), block_k=(16, 32),
                   split_k=(1, 2, 4), group_m=(8,), num_warps=(4,), num_stages=(3,), variant=("ptr",)),
}


def space(name: str) -> ConfigSpace:
    if name not in SPACES:
        raise KeyError(f"unknown config space {name!r}; known: {sorted(SPACES)}")
    return SPACES[name]


def _from_rows(rows: list[tuple[int, int, int, int, int]], order: str, group_m: int) -> tuple[TileConfig, ...]:
    """Rows of (BLOCK_M, BLOCK_N, BLOCK_K, a, b) where `order` says whether a is warps or stages."""
    out = []
    for bm, bn, bk, x, y in rows:
        warps, stages = (x, y) if order == "warps,stages" else (y, x)
        out.append(TileConfig(bm, bn, bk, 1, group_m, warps, stages))
    return tuple(out)


NAMED_LISTS: dict[str, tuple[TileConfig, ...]] = {
    # Triton tutorial 03 (matrix multiplication), get_cuda_autotune_config(): 8 fp16 + 8 fp8 configs.
    "triton_tutorial": _from_rows([
        (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
        (128, 256, 128, 3, 8), (256, 128, 128, 3, 8), (256, 64, 128, 4, 4), (64, 256, 128, 4, 4),
        (128, 128, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 32, 64, 4, 4),
    ], "stages,warps", group_m=8),
    # Inductor's max-autotune mm list for CUDA, GROUP_M 8: the 20 of torch 2.11's
    # torch/_inductor/template_heuristics (torch 2.13 adds a 21st, 128x256x64, 4 stages, 8 warps).
    "inductor_mm": _from_rows([
        (32, 32, 16, 1, 2), (32, 32, 128, 2, 4), (32, 64, 32, 5, 8), (64, 32, 32, 5, 8),
        (64, 32, 128, 5, 4), (64, 64, 16, 2, 4), (64, 64, 32, 2, 4), (64, 64, 64, 3, 8),
        (64, 64, 128, 5, 4), (64, 128, 32, 3, 4), (64, 128, 32, 4, 8), (64, 128, 64, 3, 4),
        (64, 128, 128, 4, 4), (128, 64, 32, 3, 4), (128, 64, 32, 4, 8), (128, 128, 32, 2, 8),
        (128, 128, 32, 3, 4), (128, 128, 64, 3, 4), (128, 128, 64, 5, 8), (128, 128, 128, 4, 8),
    ], "stages,warps", group_m=8),
    "seed": tuple(SPACES["seed"]),
}


def named_list(name: str) -> tuple[TileConfig, ...]:
    if name not in NAMED_LISTS:
        raise KeyError(f"unknown config list {name!r}; known: {sorted(NAMED_LISTS)}")
    return NAMED_LISTS[name]
