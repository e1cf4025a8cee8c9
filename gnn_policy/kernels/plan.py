"""A launch of the tile kernel whose host work is done once: `LaunchPlan`.

`launch.launch` works everything out on every call: operand layouts, tensor maps, grid,
arguments, and Triton's launcher binds and specialises all ~45 of them. On the H100's host
that was 160-200 us a call for a decode GEMM, against 25 us for torch's `F.linear`
(`benchmarks/host_overhead.py`, BENCHMARKS): nothing under a CUDA graph, where only replays
run, but most of an eager model's time. A call with the same shapes, strides, dtypes,
devices and 16-byte alignment as one before gets the same arguments but its tensors and the
same compiled kernel, so a plan keeps them: a call then allocates its output (and split-K
workspace), makes its tensor maps, and hands the list to the compiled kernel's launcher.

Plans cover `matmul_kernel` (the `ptr` and `tma` variants, split-K included); the persistent
kernels size their grid from the stream's SM slice at each launch and keep `launch`.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import triton
from triton.knobs import HookChain
from triton.tools.tensor_descriptor import TensorDescriptor

from gnn_policy.kernels.launch import prepare, run_prepared, tile_counters
from gnn_policy.kernels.matmul import matmul_kernel
from gnn_policy.space import TileConfig

# matmul_kernel's tensor arguments, as `launch.prepare` orders them
A, B, A_MAP, B_MAP, C, C_MAP, BIAS, RESIDUAL, WORKSPACE, COUNTERS = range(10)


def _map(d: TensorDescriptor | None) -> tuple | None:
    return None if d is None else (d.shape, d.strides, d.block_shape)


def _like(m: tuple | None, base: torch.Tensor) -> TensorDescriptor | None:
    return None if m is None else TensorDescriptor(base, *m)


@dataclasses.dataclass
class LaunchPlan:
    """What every call of one signature shares: the compiled kernel, its grid, and its
    arguments without their tensors (a plan holds no tensor: a layer keeps one per shape),
    which `bind` fills in with a call's own."""

    compiled: Any  # Triton's CompiledKernel; None under the interpreter, which has none
    grid: tuple[int, int, int]
    values: list  # every parameter of matmul_kernel, in order, constexprs included; tensors None
    out_shape: tuple[int, ...]
    c3_shape: tuple[int, int, int]  # C as the kernel indexes it: [batch, M, N]
    maps: tuple  # (shape, strides, box) of A's, B's and C's tensor maps, None where loads use pointers
    workspace: tuple[int, ...] | None  # the split-K workspace's shape
    counters: int  # split-K tile counters the launch needs (0 without split-K)

    def bind(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
             residual: torch.Tensor | None) -> tuple[torch.Tensor, list]:
        """This call's output and the kernel's arguments with its tensors in place."""
        v = self.values.copy()
        c = torch.empty(self.out_shape, device=a.device, dtype=a.dtype)
        c3 = c.view(self.c3_shape)
        v[A], v[B], v[C] = a, b, c3
        v[A_MAP], v[B_MAP], v[C_MAP] = _like(self.maps[0], a), _like(self.maps[1], b), _like(self.maps[2], c3)
        v[BIAS] = c if bias is None else bias
        v[RESIDUAL] = c if residual is None else residual.expand(self.out_shape).reshape(self.c3_shape)
        if self.workspace is not None:
            v[WORKSPACE] = torch.empty(self.workspace, device=a.device, dtype=torch.float32)
            v[COUNTERS] = tile_counters(a.device, self.counters)
        else:
            v[WORKSPACE] = v[COUNTERS] = c
        return c, v

    def run(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
            residual: torch.Tensor | None) -> torch.Tensor:
        """C for this call, launched on the current stream of a's device."""
        if a.device.index != torch.cuda.current_device():  # the kernel launches on the current device
            with torch.cuda.device(a.device):
                return self.run(a, b, bias, residual)
        c, v = self.bind(a, b, bias, residual)
        k = self.compiled
        stream = triton.runtime.driver.active.get_current_stream(a.device.index)
        enter, leave = _live(triton.knobs.runtime.launch_enter_hook), _live(triton.knobs.runtime.launch_exit_hook)
        meta = k.launch_metadata(self.grid, stream, *v) if enter or leave else None
        k.run(*self.grid, stream, k.function, k.packed_metadata, meta, enter, leave, *v)
        return c


def _live(hook: Any) -> Any:
    """A launch hook (a profiler's), or None where none is set: Triton keeps an empty chain
    there, and the launcher skips a None hook, so its metadata need not be built."""
    return None if hook is None or (isinstance(hook, HookChain) and not hook.calls) else hook


def make_plan(a: torch.Tensor, b: torch.Tensor, config: TileConfig, *, bias: torch.Tensor | None,
              activation: str | None, residual: torch.Tensor | None) -> tuple[torch.Tensor, LaunchPlan | None]:
    """Run this call as `launch.launch` does and return C with the plan for calls like it
    (None for a persistent variant)."""
    kernel, c, g, args, meta = prepare(a, b, config, bias, activation, residual, None)
    cuda = a.device.type == "cuda"
    with torch.cuda.device(a.device) if cuda else contextlib.nullcontext():  # Triton launches on the current device
        run_prepared(kernel, g, args, meta, config, a.device, None)
        # the call compiled it: warmup finds it in Triton's cache (the interpreter compiles nothing)
        compiled = kernel.warmup(*args, grid=g, **meta) if kernel is matmul_kernel and cuda else None
    if kernel is not matmul_kernel:
        return c, None
    values = list(args) + [meta[name] for name in kernel.arg_names[len(args):]]
    c3_shape = tuple(values[C].shape)
    maps = tuple(_map(values[i]) for i in (A_MAP, B_MAP, C_MAP))
    split = config.split_k > 1
    workspace = tuple(values[WORKSPACE].shape) if split else None
    for i in (A, B, A_MAP, B_MAP, C, C_MAP, BIAS, RESIDUAL, WORKSPACE, COUNTERS):
        values[i] = None
    return c, LaunchPlan(compiled, tuple(g), values, tuple(c.shape), c3_shape, maps, workspace,
                         c3_shape[0] * g[0] if split else 0)
