"""The persistent variants of the template: a grid of about as many programs as the GPU holds
at once, each looping over output tiles in GROUP_M order, with TMA loads and stores.

Why: with one program per tile, a 1000^3 GEMM runs 128 programs of one warpgroup at 6%
occupancy, and every program pays its own prologue (descriptor fetch, pipeline fill) and
epilogue while its tensor cores idle. A persistent program keeps its pipeline across tiles:
Triton flattens the tile loop and the K loop into one software-pipelined loop on Hopper, so
the next tile's loads are in flight while this tile's epilogue runs.

Three variants share this kernel:
* `persistent`: the flattened, pipelined loop.
* `subtile`: the same loop storing C by TMA in two halves along N. The staged output is kept
  apart from the pipeline's buffers (so the store overlaps the next tile's loads); halving it
  frees room for another stage, e.g. a fourth 48 KB stage beside a 128x256 bf16 tile.
* `warpspec`: the tile loop with Triton's automatic warp specialisation on Hopper
  (`tl.range(..., warp_specialize=True)`): a 4-warp kernel becomes a producer warp group that
  issues the TMA loads and two consumer warp groups that split the tile's rows, run the MMAs
  and the epilogue (12 warps, registers moved to the consumers with `setmaxnreg`), the
  structure of cuBLAS's Hopper kernels. The consumers store C with pointer stores. Its A and B
  tensor maps are made in the kernel (`DEVICE_DESC`), not passed from the host: splitting the
  tile halves each TMA copy's destination, and Triton 3.6 re-derives the box of a map made in
  the kernel but keeps a host map's, so a 128x64 box was copied into a 64x64 buffer whose
  barrier waited for half the bytes (seen in the compiled TTGIR; triton-lang/triton#11587),
  which is how the host-map kernels hung on the H100 and the H200.

`streamk_kernel` is the fourth, `streamk`: each program takes an equal run of the (tile, K tile)
iterations, so a GEMM of fewer tiles than SMs (M of 100-300, N and K in the thousands) or a last
partial wave keeps every SM busy. Triton does not flatten its tile loop (the epilogue's
reduction is a loop of its own); the K loop inside is pipelined as in the other variants.

Split-K is kept: a work unit is (batch, tile, K slice), and the reduction is the one of
`matmul.py` (partials to a workspace, the last slice to arrive sums them in slice order), so
the result is deterministic and no program ever waits on another (a grid larger than what
the GPU holds at once is slower, never wrong).
"""
from __future__ import annotations

import triton
import triton.language as tl

from gnn_policy.kernels.matmul import _epilogue, _finish, _tile_coords, _tma_k_loop


@triton.jit(do_not_specialize=["num_programs"])
def persistent_kernel(
        a_desc, b_desc, c_ptr, c_desc, bias_ptr, res_ptr, ws_ptr, lock_ptr,
        M, N, K, batch, num_programs,
        stride_cb, stride_cm, stride_cn, stride_rb, stride_rm, stride_rn,
        a_desc_rows, b_desc_rows, c_desc_rows, a_map_rows, a_map_cols, a_map_stride,
        b_map_rows, b_map_cols, b_map_stride,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
        A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, MASK_A_K: tl.constexpr,
        MASK_B_K: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr, TMA_STORE: tl.constexpr, DOT_PRECISION: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr, DEVICE_DESC: tl.constexpr):
    if DEVICE_DESC:
        # a_desc and b_desc are the operands' first elements; the maps are launch's, [rows, cols]
        # with cols contiguous and the batches folded into rows
        if A_K_MAJOR:
            a_desc = tl.make_tensor_descriptor(a_desc, [a_map_rows, a_map_cols], [a_map_stride, 1], [BLOCK_M, BLOCK_K])
        else:
            a_desc = tl.make_tensor_descriptor(a_desc, [a_map_rows, a_map_cols], [a_map_stride, 1], [BLOCK_K, BLOCK_M])
        if B_K_MAJOR:
            b_desc = tl.make_tensor_descriptor(b_desc, [b_map_rows, b_map_cols], [b_map_stride, 1], [BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_desc, [b_map_rows, b_map_cols], [b_map_stride, 1], [BLOCK_K, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    units = batch * tiles * SPLIT_K
    # K slices of one tile are neighbouring units: they run at the same time on different
    # SMs, so the partials meet in L2 and the last slice rarely waits on HBM.
    # Triton 3.6 warp-specialises on Hopper only a loop it has not flattened.
    for unit in tl.range(tl.program_id(0), units, num_programs, flatten=not WARP_SPECIALIZE,
                         warp_specialize=WARP_SPECIALIZE):
        pid_b = unit // (tiles * SPLIT_K)
        rest = unit % (tiles * SPLIT_K)
        pid = rest // SPLIT_K
        pid_k = rest % SPLIT_K
        pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k_first = pid_k * tiles_per_split
        k_last = min(k_first + tiles_per_split, k_tiles)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tma_k_loop(a_desc, b_desc, acc, pid_b * a_desc_rows, pid_b * b_desc_rows, pid_m, pid_n,
                      k_first, k_last, K, BLOCK_M, BLOCK_N, BLOCK_K, A_K_MAJOR, B_K_MAJOR,
                      MASK_A_K, MASK_B_K, DOT_PRECISION)
        c_base = c_ptr + pid_b * stride_cb
        r_base = res_ptr + pid_b * stride_rb
        c_row0 = pid_b * c_desc_rows
        _finish(acc, (pid_b * tiles + pid).to(tl.int64), pid_k, pid_m, pid_n, M, N, c_base, c_desc,
                c_row0, stride_cm, stride_cn, bias_ptr, r_base, stride_rm, stride_rn, ws_ptr, lock_ptr,
                BLOCK_M, BLOCK_N, SPLIT_K, ACTIVATION, HAS_BIAS, HAS_RESIDUAL, TMA_STORE)


def units(config, m: int, n: int, batch: int) -> int:
    """Work units of a persistent launch: one per (batch, output tile, K slice)."""
    return triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n) * config.split_k * batch


@triton.jit(do_not_specialize=["K", "num_programs", "dp_tiles", "per_program", "max_parts"])
def streamk_kernel(
        a_desc, b_desc, c_ptr, c_desc, bias_ptr, res_ptr, ws_ptr, lock_ptr,
        M, N, K, batch, num_programs, dp_tiles, per_program, max_parts,
        stride_cb, stride_cm, stride_cn, stride_rb, stride_rm, stride_rn,
        a_desc_rows, b_desc_rows, c_desc_rows,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, MASK_A_K: tl.constexpr,
        MASK_B_K: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr, TMA_STORE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Stream-K with data-parallel waves first (CUTLASS's hybrid). The first `dp_tiles` tiles (whole
    waves) go round robin as in `persistent`, so the tiles running at once are neighbours in
    GROUP_M order and share L2. The (tile, K tile) iterations of the rest, one to two waves' worth,
    are cut into equal runs of `per_program`, so no SM idles in the last wave (all of a 2x36-tile
    GEMM on 132 SMs). A tile cut between programs is summed like a split-K tile: each part writes
    its fp32 partial to slot (program - first program of the tile), and the last part to arrive
    sums the slots in order."""
    tiles_mn = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    program = tl.program_id(0)
    for tile in tl.range(program, dp_tiles, num_programs, flatten=True):
        pid_b = tile // tiles_mn
        pid_m, pid_n = _tile_coords(tile % tiles_mn, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tma_k_loop(a_desc, b_desc, acc, pid_b * a_desc_rows, pid_b * b_desc_rows, pid_m, pid_n,
                          0, k_tiles, K, BLOCK_M, BLOCK_N, BLOCK_K, A_K_MAJOR, B_K_MAJOR,
                          MASK_A_K, MASK_B_K, DOT_PRECISION)
        _epilogue(acc, pid_m, pid_n, M, N, c_ptr + pid_b * stride_cb, c_desc, pid_b * c_desc_rows, stride_cm,
                  stride_cn, bias_ptr, res_ptr + pid_b * stride_rb, stride_rm, stride_rn, BLOCK_M, BLOCK_N,
                  ACTIVATION, HAS_BIAS, HAS_RESIDUAL, TMA_STORE)
    # int64: tiles x K tiles passes 2^31 for small tiles of a large problem
    # (any of M, N, batch equal to 1 arrives as a constant, which has no .to)
    zero = program.to(tl.int64) * 0
    base = (zero + dp_tiles) * k_tiles
    start = base + program * per_program
    end = tl.minimum(start + per_program, (zero + batch) * tiles_mn * k_tiles)
    for tile in tl.range((start // k_tiles).to(tl.int32), tl.cdiv(end, k_tiles).to(tl.int32)):
        pid_b = tile // tiles_mn
        pid_m, pid_n = _tile_coords(tile % tiles_mn, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        tile64 = zero + tile  # (the interpreter's loop index is a Python int)
        k_first = tl.maximum(start - tile64 * k_tiles, 0).to(tl.int32)
        k_last = tl.minimum(end - tile64 * k_tiles, k_tiles).to(tl.int32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tma_k_loop(a_desc, b_desc, acc, pid_b * a_desc_rows, pid_b * b_desc_rows, pid_m, pid_n,
                          k_first, k_last, K, BLOCK_M, BLOCK_N, BLOCK_K, A_K_MAJOR, B_K_MAJOR,
                          MASK_A_K, MASK_B_K, DOT_PRECISION)
        first_part = (tile64 * k_tiles - base) // per_program
        parts = (((tile64 + 1) * k_tiles - 1 - base) // per_program - first_part + 1).to(tl.int32)
        _finish_parts(acc, tile64 - dp_tiles, (program - first_part).to(tl.int32), parts, max_parts, pid_m, pid_n,
                      M, N, c_ptr + pid_b * stride_cb, c_desc, pid_b * c_desc_rows, stride_cm, stride_cn, bias_ptr,
                      res_ptr + pid_b * stride_rb, stride_rm, stride_rn, ws_ptr, lock_ptr, BLOCK_M, BLOCK_N,
                      ACTIVATION, HAS_BIAS, HAS_RESIDUAL, TMA_STORE)


@triton.jit
def _finish_parts(acc, tile, part, parts, max_parts, pid_m, pid_n, M, N, c_base, c_desc, c_row0, stride_cm,
                  stride_cn, bias_ptr, r_base, stride_rm, stride_rn, ws_ptr, lock_ptr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr, TMA_STORE: tl.constexpr):
    """`_finish` for a tile cut into a run-time number of parts (1: no reduction)."""
    if parts == 1:
        _epilogue(acc, pid_m, pid_n, M, N, c_base, c_desc, c_row0, stride_cm, stride_cn, bias_ptr,
                  r_base, stride_rm, stride_rn, BLOCK_M, BLOCK_N, ACTIVATION, HAS_BIAS, HAS_RESIDUAL,
                  TMA_STORE)
    else:
        offs_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        ws_tile = ws_ptr + tile * max_parts * (BLOCK_M * BLOCK_N)
        tl.store(ws_tile + part * (BLOCK_M * BLOCK_N) + offs_tile, acc)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == parts - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(parts):  # in part order, whichever part arrived last: deterministic
                total += tl.load(ws_tile + s * (BLOCK_M * BLOCK_N) + offs_tile, cache_modifier=".cg")
            _epilogue(total, pid_m, pid_n, M, N, c_base, c_desc, c_row0, stride_cm, stride_cn, bias_ptr,
                      r_base, stride_rm, stride_rn, BLOCK_M, BLOCK_N, ACTIVATION, HAS_BIAS, HAS_RESIDUAL,
                      TMA_STORE)
            tl.store(lock_ptr + tile, 0)  # left at 0 for the next launch, as `_finish` does


def streamk_split(config, m: int, n: int, k: int, batch: int, programs: int) -> tuple[int, int, int, int]:
    """(programs, data-parallel tiles, stream-K iterations per program, most parts a tile is cut
    into) of a stream-K launch: whole waves but the last one or two go data-parallel."""
    k_tiles = triton.cdiv(k, config.block_k)
    tiles = units(config, m, n, batch)
    programs = max(1, min(programs, tiles * k_tiles))
    dp = (tiles // programs - 1) * programs if tiles >= 2 * programs else 0
    per = triton.cdiv((tiles - dp) * k_tiles, programs)
    cut = {dp + (p * per) // k_tiles for p in range(1, programs)} & set(range(dp, tiles))
    parts = max([1] + [((t + 1 - dp) * k_tiles - 1) // per - ((t - dp) * k_tiles) // per + 1 for t in cut])
    return programs, dp, per, parts
