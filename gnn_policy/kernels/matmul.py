"""The Triton GEMM template: C = act(A @ B + bias) + residual.

Written like Triton's tutorial 03 (one kernel, its configs as data, checked against torch),
with four additions the tutorial lacks:

* two load variants. `ptr` builds pointer tiles from strides (any layout, any alignment);
  `tma` reads through Hopper tensor descriptors, which need only 16-byte aligned strides and
  zero-fill out-of-bounds boxes, so a 1000-wide row is read at full width where pointer loads
  fall back to scalar accesses (Triton proves vector alignment only for multiples of 16).
* a batch axis on the grid (either operand may be broadcast over it).
* split-K with a deterministic, single-launch reduction: every K slice writes its fp32
  partial tile to a workspace, bumps a per-tile counter, and the slice that arrives last sums
  the partials in slice order, runs the epilogue and resets the counter to zero (so the
  counters are reused without a memset). Atomics on the output would be cheaper
  but non-deterministic and cannot apply a non-linear epilogue after the sum; a second
  reduction kernel would cost a launch, which dominates on the small-M shapes split-K is for.
* the fused epilogue (bias, relu / gelu / silu, residual) in fp32 before the cast.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gnn_policy.space import TileConfig

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "silu": 3}


@triton.jit
def _tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # GROUP_M swizzle (tutorial 03): consecutive programs share B columns for L2 reuse.
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_size
    pid_n = (pid % width) // group_size
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, pid_m, pid_n, M, N, c_ptr, c_desc, c_row0, stride_cm, stride_cn, bias_ptr,
              res_ptr, stride_rm, stride_rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
              TMA_STORE: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    if ACTIVATION == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACTIVATION == 2:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    elif ACTIVATION == 3:
        acc = acc * tl.sigmoid(acc)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn,
                      mask=mask, other=0.0)
        acc = acc + res.to(tl.float32)
    # TMA_STORE: 0 pointer stores, 1 the tile in one TMA store, 2 in two halves along N. The
    # descriptor clips at M and N; rows stay inside one batch (see launch).
    if TMA_STORE == 1:
        c_desc.store([c_row0 + pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
    elif TMA_STORE == 2:
        # Half-tile stores stage half the tile in shared memory, which a persistent program
        # keeps apart from its pipeline: the room goes to a deeper pipeline.
        halves = tl.permute(tl.reshape(acc.to(c_desc.dtype), (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([c_row0 + pid_m * BLOCK_M, pid_n * BLOCK_N], left)
        c_desc.store([c_row0 + pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right)
    else:
        c = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tma_k_loop(a_desc, b_desc, acc, a_row0, b_row0, pid_m, pid_n, k_first, k_last, K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, MASK_A_K: tl.constexpr,
                MASK_B_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + the TMA-loaded A and B tiles of K tiles [k_first, k_last) of one output tile."""
    offs_k = tl.arange(0, BLOCK_K)
    for kt in range(k_first, k_last):
        k0 = kt * BLOCK_K
        if A_K_MAJOR:  # A row-major: descriptor over [rows=M, cols=K]
            a = a_desc.load([a_row0 + pid_m * BLOCK_M, k0])
        else:  # A column-major: descriptor over A^T, [rows=K, cols=M]
            a = a_desc.load([a_row0 + k0, pid_m * BLOCK_M]).T
        if B_K_MAJOR:  # B column-major: descriptor over B^T, [rows=N, cols=K]
            b = b_desc.load([b_row0 + pid_n * BLOCK_N, k0]).T
        else:  # B row-major: descriptor over [rows=K, cols=N]
            b = b_desc.load([b_row0 + k0, pid_n * BLOCK_N])
        # A K tail read across a folded batch boundary holds the next batch's values.
        if MASK_A_K:
            a = tl.where((k0 + offs_k)[None, :] < K, a, 0.0)
        if MASK_B_K:
            b = tl.where((k0 + offs_k)[:, None] < K, b, 0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def matmul_kernel(
        a_ptr, b_ptr, a_desc, b_desc, c_ptr, c_desc, bias_ptr, res_ptr, ws_ptr, lock_ptr,
        M, N, K,
        stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
        stride_cb, stride_cm, stride_cn, stride_rb, stride_rm, stride_rn,
        a_desc_rows, b_desc_rows, c_desc_rows,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, USE_TMA: tl.constexpr,
        A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, MASK_A_K: tl.constexpr,
        MASK_B_K: tl.constexpr, EVEN_K: tl.constexpr, ACTIVATION: tl.constexpr,
        HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, TMA_STORE: tl.constexpr,
        DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2)
    pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * tiles_per_split
    k_last = min(k_first + tiles_per_split, k_tiles)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if USE_TMA:
        # Batches are folded into the descriptor's rows: `*_desc_rows` is the row offset of
        # one batch (0 when the operand is broadcast over the batch).
        acc = _tma_k_loop(a_desc, b_desc, acc, pid_b * a_desc_rows, pid_b * b_desc_rows, pid_m, pid_n,
                          k_first, k_last, K, BLOCK_M, BLOCK_N, BLOCK_K, A_K_MAJOR, B_K_MAJOR,
                          MASK_A_K, MASK_B_K, DOT_PRECISION)
    else:
        # Rows past M / columns past N wrap around: always in bounds, never stored.
        rm = offs_m % M
        rn = offs_n % N
        a_base = a_ptr + pid_b * stride_ab + rm[:, None] * stride_am
        b_base = b_ptr + pid_b * stride_bb + rn[None, :] * stride_bn
        for kt in range(k_first, k_last):
            ks = kt * BLOCK_K + offs_k
            a_ptrs = a_base + ks[None, :] * stride_ak
            b_ptrs = b_base + ks[:, None] * stride_bk
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=ks[None, :] < K, other=0.0)
                b = tl.load(b_ptrs, mask=ks[:, None] < K, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    c_base = c_ptr + pid_b * stride_cb
    r_base = res_ptr + pid_b * stride_rb
    c_row0 = pid_b * c_desc_rows
    _finish(acc, (pid_b * tl.num_programs(0) + pid).to(tl.int64), pid_k, pid_m, pid_n, M, N, c_base,
            c_desc, c_row0, stride_cm, stride_cn, bias_ptr, r_base, stride_rm, stride_rn, ws_ptr,
            lock_ptr, BLOCK_M, BLOCK_N, SPLIT_K, ACTIVATION, HAS_BIAS, HAS_RESIDUAL, TMA_STORE)


@triton.jit
def _finish(acc, tile, pid_k, pid_m, pid_n, M, N, c_base, c_desc, c_row0, stride_cm, stride_cn,
            bias_ptr, r_base, stride_rm, stride_rn, ws_ptr, lock_ptr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, ACTIVATION: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, TMA_STORE: tl.constexpr):
    """The epilogue of one output tile, after the split-K reduction when K was split."""
    if SPLIT_K == 1:
        _epilogue(acc, pid_m, pid_n, M, N, c_base, c_desc, c_row0, stride_cm, stride_cn, bias_ptr,
                  r_base, stride_rm, stride_rn, BLOCK_M, BLOCK_N, ACTIVATION, HAS_BIAS,
                  HAS_RESIDUAL, TMA_STORE)
    else:
        # Workspace [tiles, SPLIT_K, BLOCK_M, BLOCK_N] fp32: whole tiles, contiguous, so the
        # partials move as unmasked vector accesses whatever M and N are.
        offs_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        ws_tile = ws_ptr + tile * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(ws_tile + pid_k * (BLOCK_M * BLOCK_N) + offs_tile, acc)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                # .cg reads from L2, where the other slices' writes are visible.
                total += tl.load(ws_tile + s * (BLOCK_M * BLOCK_N) + offs_tile, cache_modifier=".cg")
            _epilogue(total, pid_m, pid_n, M, N, c_base, c_desc, c_row0, stride_cm, stride_cn,
                      bias_ptr, r_base, stride_rm, stride_rn, BLOCK_M, BLOCK_N, ACTIVATION,
                      HAS_BIAS, HAS_RESIDUAL, TMA_STORE)
            # Every slice has arrived: leave the counter at 0 for the next launch, which
            # saves a memset kernel (~1.8 us on the H200) before every split-K call.
            tl.store(lock_ptr + tile, 0)


def grid(config: TileConfig, m: int, n: int, batch: int) -> tuple[int, int, int]:
    return (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), config.split_k, batch)


def workspace_shape(config: TileConfig, m: int, n: int, batch: int) -> tuple[int, int, int, int]:
    """The split-K reduction's fp32 workspace: one whole tile per (output tile, K slice)."""
    tiles = grid(config, m, n, batch)[0] * batch
    return (tiles, config.split_k, config.block_m, config.block_n)


def even_k(config: TileConfig, k: int) -> bool:
    """True when K is whole tiles: slices cover whole tiles, so pointer loads need no K mask."""
    return k % config.block_k == 0
