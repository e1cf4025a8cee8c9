"""Host side of the template: operand layouts, TMA descriptors, workspace, launch.

`launch` trusts its arguments (shapes, dtypes and devices are checked by `gnn_policy.ops`);
what it checks is whether the config's load variant can serve these particular tensors.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from gnn_policy.calibration import tf32_enabled
from gnn_policy.kernels.matmul import ACTIVATIONS, even_k, grid, matmul_kernel, workspace_shape
from gnn_policy.kernels.persistent import persistent_kernel, streamk_kernel, streamk_split, units
from gnn_policy.space import PERSISTENT_VARIANTS, TMA_VARIANTS, TileConfig, Violation

TMA_ALIGN = 16  # bytes: base address and every non-innermost stride of a tensor map


class LayoutError(ValueError):
    """The config's load variant cannot read these tensors (e.g. TMA on unaligned strides)."""

    def __init__(self, violation: Violation):
        super().__init__(str(violation))
        self.violation = violation


@dataclasses.dataclass(frozen=True)
class Operand:
    """A [batch?, rows, cols] operand seen as the kernel sees it."""

    tensor: torch.Tensor
    batch_stride: int  # 0 when the operand is broadcast over the batch
    stride_outer: int  # stride of dim -2
    stride_inner: int  # stride of dim -1


def _operand(t: torch.Tensor, batch: int) -> Operand:
    batch_stride = t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else 0
    return Operand(t, batch_stride if batch > 1 else 0, t.stride(-2), t.stride(-1))


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """A 2-D tensor map over an operand: [rows, cols] with cols contiguous, batches folded into
    rows, read in boxes of `box`. Built on the host (`host`) for every TMA variant but
    `warpspec`, which builds it in the kernel from these fields (see kernels/persistent.py)."""

    tensor: torch.Tensor
    rows: int
    cols: int
    row_stride: int
    box: tuple[int, int]

    def host(self) -> TensorDescriptor:
        return TensorDescriptor(self.tensor, [self.rows, self.cols], [self.row_stride, 1], list(self.box))


def _descriptor(name: str, op: Operand, block_rows: int, block_cols: int, batch: int) -> tuple[TensorMap, int]:
    """The operand's tensor map, a transposed operand described through its transpose, and the
    row offset of one batch in it."""
    t = op.tensor
    if op.stride_inner == 1:
        rows, cols, row_stride = t.shape[-2], t.shape[-1], op.stride_outer
    else:
        rows, cols, row_stride = t.shape[-1], t.shape[-2], op.stride_inner
    esize = t.element_size()
    if t.data_ptr() % TMA_ALIGN or (row_stride * esize) % TMA_ALIGN:
        raise LayoutError(Violation("tma-alignment", (
            f"{name} needs a 16-byte aligned base and row stride for TMA; got a row stride of "
            f"{row_stride} x {esize} bytes; use variant='ptr'")))
    folded = batch if op.batch_stride else 1
    if folded > 1 and op.batch_stride != rows * row_stride:
        raise LayoutError(Violation("tma-batch-stride", (
            f"{name}'s batches are not contiguous rows (batch stride {op.batch_stride}, "
            f"expected {rows * row_stride}); use variant='ptr'")))
    return TensorMap(t, folded * rows, cols, row_stride, (block_rows, block_cols)), (rows if folded > 1 else 0)


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Tensor maps made in a kernel live in global scratch that Triton asks the caller's
    allocator for at launch: install one on torch's caching allocator (on the current device),
    unless the caller has set their own."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


_COUNTERS: dict[tuple[torch.device, int, bool], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def tile_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 split-K tile counters for the current stream.

    The kernel's last K slice resets its tile's counter, so the buffer is zero again after
    every launch and is reused without a memset. One buffer per stream, because launches on
    one stream run in order; two CUDA graphs captured on one stream share it, so do not
    replay them concurrently. A buffer is never freed (a captured graph may hold its address),
    and one first made during a capture is kept apart from eager use: its zero-fill runs only
    when the graph replays.
    """
    cuda = device.type == "cuda"
    stream = torch.cuda.current_stream(device).stream_id if cuda else 0
    capturing = cuda and torch.cuda.is_current_stream_capturing()
    buf = _COUNTERS.get((device, stream, False))
    if capturing and (buf is None or buf.numel() < n):
        buf = _COUNTERS.get((device, stream, True))
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[(device, stream, capturing)] = buf
    return buf


def max_offset(t: torch.Tensor) -> int:
    """The largest element offset from `t`'s first element (what the kernel's int32 math reaches)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


def dot_precision(a: torch.Tensor) -> str:
    """fp32 follows torch's matmul setting; fp16 / bf16 ignore it."""
    if a.dtype != torch.float32 or a.device.type == "cpu":
        return "tf32"
    return "tf32" if tf32_enabled() else "ieee"


def _output_descriptor(c3: torch.Tensor, config: TileConfig) -> tuple[TensorDescriptor | None, int]:
    """A tensor map for storing C, where one is safe: pointer stores otherwise.

    The store box clips only at the map's edges, so folded batches need M to be whole
    tiles, or the last tile of one batch would overwrite the first rows of the next.
    """
    batch, m, n = c3.shape
    if (n * c3.element_size()) % TMA_ALIGN or c3.data_ptr() % TMA_ALIGN:
        return None, 0
    if batch > 1 and m % config.block_m:
        return None, 0
    box_n = config.block_n // 2 if config.variant == "subtile" else config.block_n
    desc = TensorDescriptor(c3, [batch * m, n], [n, 1], [config.block_m, box_n])
    return desc, m


def _k_major(name: str, op: Operand, k_dim: int) -> bool:
    """Whether K is the operand's contiguous dimension (TMA needs one unit-stride dimension)."""
    if op.stride_inner == 1:
        return k_dim == -1
    if op.stride_outer == 1:
        return k_dim == -2
    raise LayoutError(Violation("tma-layout", (
        f"{name} has no unit-stride dimension (strides {tuple(op.tensor.stride())}); "
        "use variant='ptr'")))


def _tma_args(config: TileConfig, pa: Operand, pb: Operand, k: int, batch: int) -> dict:
    a_kmaj = _k_major("A", pa, -1)
    b_kmaj = _k_major("B", pb, -2)
    a_box = (config.block_m, config.block_k) if a_kmaj else (config.block_k, config.block_m)
    b_box = (config.block_n, config.block_k) if b_kmaj else (config.block_k, config.block_n)
    a_map, a_rows = _descriptor("A", pa, *a_box, batch)
    b_map, b_rows = _descriptor("B", pb, *b_box, batch)
    tail = k % config.block_k != 0
    return dict(a_map=a_map, b_map=b_map, a_rows=a_rows, b_rows=b_rows, A_K_MAJOR=a_kmaj,
                B_K_MAJOR=b_kmaj, MASK_A_K=tail and not a_kmaj and a_rows > 0,
                MASK_B_K=tail and not b_kmaj and b_rows > 0)


def prepare(a: torch.Tensor, b: torch.Tensor, config: TileConfig, bias: torch.Tensor | None,
            activation: str | None, residual: torch.Tensor | None, out: torch.Tensor | None,
            compile_only: bool = False) -> tuple[Any, torch.Tensor, tuple, tuple, dict]:
    """Kernel, output, grid, arguments and meta-parameters for one call.

    `compile_only` stands one-element buffers in for the split-K workspace and counters: the
    kernel's specialisation depends on their dtype and alignment, not their size, and a
    large problem's workspace (GBs) in every compile process would crowd out the GPU.
    """
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out_shape = (batch, m, n) if max(a.dim(), b.dim()) == 3 else (m, n)
    c = torch.empty(out_shape, device=a.device, dtype=a.dtype) if out is None else out
    pa, pb = _operand(a, batch), _operand(b, batch)
    c3 = c.view(batch, m, n)
    t = dict(a_map=None, b_map=None, a_rows=0, b_rows=0, A_K_MAJOR=True, B_K_MAJOR=False,
             MASK_A_K=False, MASK_B_K=False)
    if config.variant in TMA_VARIANTS:
        t = _tma_args(config, pa, pb, k, batch)
    g = grid(config, m, n, batch)
    ws = lock = c
    # stand-ins: stream-K's workspace is sized in `_run`, once the grid is known; a compile needs none
    if config.variant == "streamk" or (config.split_k > 1 and compile_only):
        ws = torch.empty(1, device=a.device, dtype=torch.float32)
        lock = torch.empty(1, device=a.device, dtype=torch.int32)
    elif config.split_k > 1:
        ws = torch.empty(workspace_shape(config, m, n, batch), device=a.device, dtype=torch.float32)
        lock = tile_counters(a.device, batch * g[0])
    tma_store = config.variant in TMA_VARIANTS and config.variant != "warpspec"  # see persistent.py
    c_desc, c_rows = _output_descriptor(c3, config) if tma_store else (None, 0)
    r = residual.expand(c.shape).reshape(batch, m, n) if residual is not None else None
    rs = r.stride() if r is not None else (0, 0, 0)
    epilogue = (c if bias is None else bias, c if r is None else r, ws, lock)
    meta = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                SPLIT_K=config.split_k, GROUP_M=config.group_m, ACTIVATION=ACTIVATIONS[activation],
                HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
                TMA_STORE=0 if c_desc is None else 2 if config.variant == "subtile" else 1,
                DOT_PRECISION=dot_precision(a),
                num_warps=config.num_warps, num_stages=config.num_stages)
    maps = (t.pop("a_map"), t.pop("b_map"))
    device_maps = config.variant == "warpspec"
    descs = tuple(None if x is None else x.tensor if device_maps else x.host() for x in maps)
    rows = (t.pop("a_rows"), t.pop("b_rows"), c_rows)
    if config.variant == "streamk":
        args = (*descs, c3, c_desc, *epilogue, m, n, k, batch, 1, 0, 1, 1, *c3.stride(), *rs, *rows)
        meta.pop("SPLIT_K")
        return streamk_kernel, c, (1,), args, dict(meta, **t)
    if config.variant in PERSISTENT_VARIANTS:
        map_args = tuple(v for x in maps for v in ((x.rows, x.cols, x.row_stride) if device_maps else (0, 0, 0)))
        args = (*descs, c3, c_desc, *epilogue, m, n, k, batch, 1, *c3.stride(), *rs, *rows, *map_args)
        meta.update(WARP_SPECIALIZE=device_maps, DEVICE_DESC=device_maps, **t)
        return persistent_kernel, c, (1,), args, meta
    args = (a, b, *descs, c3, c_desc, *epilogue, m, n, k, pa.batch_stride, a.stride(-2),
            a.stride(-1), pb.batch_stride, b.stride(-2), b.stride(-1), *c3.stride(), *rs, *rows)
    meta.update(USE_TMA=config.variant == "tma", EVEN_K=even_k(config, k), **t)
    return matmul_kernel, c, g, args, meta


_PROGRAMS_ARG = 12  # index of `num_programs` in persistent_kernel's arguments
_STREAM_SMS: dict[int, int] = {}
_RESIDENT: dict[tuple, int] = {}


def set_stream_sms(stream: torch.cuda.Stream, sm_count: int) -> None:
    """Tell persistent launches on `stream` (an SM slice's) how many SMs they may fill."""
    _STREAM_SMS[stream.stream_id] = sm_count


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter runs programs one after another: a few exercise the loop
    stream = torch.cuda.current_stream(device).stream_id
    return _STREAM_SMS.get(stream) or torch.cuda.get_device_properties(device).multi_processor_count


def _resident(compiled: Any, device: torch.device) -> int:
    """Programs of this compiled kernel one SM holds at once (shared memory, threads, registers)."""
    props = torch.cuda.get_device_properties(device)
    compiled._init_handles()
    threads = 32 * compiled.metadata.num_warps
    by_smem = props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024)
    by_threads = props.max_threads_per_multi_processor // threads
    by_regs = props.regs_per_multiprocessor // max(1, compiled.n_regs * threads)
    return max(1, min(by_smem, by_threads, by_regs))


def _resident_of(kernel: Any, args: tuple, meta: dict, config: TileConfig, device: torch.device) -> int:
    """Programs of this launch's compiled kernel one SM holds at once (1 off the GPU), cached."""
    if device.type != "cuda":
        return 1
    key = (device, config, args[2].dtype, *sorted((k, str(v)) for k, v in meta.items()))
    if key not in _RESIDENT:
        _RESIDENT[key] = _resident(kernel.warmup(*args, grid=(1,), **meta), device)
    return _RESIDENT[key]


def _programs(kernel: Any, args: tuple, meta: dict, config: TileConfig, device: torch.device,
              programs: int | None) -> tuple:
    """The persistent grid: as many programs as the GPU (or slice) holds, at most one per unit."""
    m, n, batch = args[8], args[9], args[11]
    work = units(config, m, n, batch)
    if programs is None:
        programs = _sm_count(device) * _resident_of(kernel, args, meta, config, device)
    args = list(args)
    args[_PROGRAMS_ARG] = max(1, min(programs, work))
    return tuple(args), (args[_PROGRAMS_ARG],)


def launch(a: torch.Tensor, b: torch.Tensor, config: TileConfig, *, bias: torch.Tensor | None,
           activation: str | None, residual: torch.Tensor | None,
           out: torch.Tensor | None = None, programs: int | None = None) -> torch.Tensor:
    """Run the template for a [B?, M, K] @ [B?, K, N] problem and return C.

    `out` (contiguous, C's shape) is written in place. `programs` sets a persistent variant's
    grid (default: what the GPU, or the SM slice of the current stream, holds at once).
    """
    kernel, c, g, args, meta = prepare(a, b, config, bias, activation, residual, out)
    if a.device.type == "cuda" and a.device.index not in (None, torch.cuda.current_device()):
        with torch.cuda.device(a.device):  # Triton launches on the current device
            run_prepared(kernel, g, args, meta, config, a.device, programs)
    else:
        run_prepared(kernel, g, args, meta, config, a.device, programs)
    return c


def run_prepared(kernel: Any, g: tuple, args: tuple, meta: dict, config: TileConfig, device: torch.device,
                 programs: int | None) -> None:
    """Launch what `prepare` returned; a persistent variant's grid (and stream-K's split) is set here."""
    if meta.get("DEVICE_DESC") and device.type == "cuda":
        ensure_allocator()
    if kernel is persistent_kernel:
        args, g = _programs(kernel, args, meta, config, device, programs)
    elif kernel is streamk_kernel:
        args, g = _streamk_programs(kernel, args, meta, config, device, programs)
    kernel[g](*args, **meta)


def _streamk_programs(kernel: Any, args: tuple, meta: dict, config: TileConfig, device: torch.device,
                      programs: int | None) -> tuple:
    """A stream-K launch's grid, iterations per program and its partials' workspace."""
    m, n, k, batch = args[8:12]
    if programs is None:
        programs = _sm_count(device) * _resident_of(kernel, args, meta, config, device)
    programs, dp, per, parts = streamk_split(config, m, n, k, batch, programs)
    args = list(args)
    args[_PROGRAMS_ARG:_PROGRAMS_ARG + 4] = [programs, dp, per, parts]
    if parts > 1:  # partials of the stream-K tiles alone, indexed from the first of them
        tiles = units(config, m, n, batch) - dp
        args[6] = torch.empty((tiles, parts, config.block_m, config.block_n), device=device, dtype=torch.float32)
        args[7] = tile_counters(device, tiles)
    return tuple(args), (programs,)


def compile_kernel(a: torch.Tensor, b: torch.Tensor, config: TileConfig, *, bias: torch.Tensor | None,
                   activation: str | None, residual: torch.Tensor | None) -> Any:
    """Compile (without running) the kernel these arguments need; returns Triton's CompiledKernel."""
    kernel, _, g, args, meta = prepare(a, b, config, bias, activation, residual, None, compile_only=True)
    with torch.cuda.device(a.device):
        return kernel.warmup(*args, grid=g, **meta)
