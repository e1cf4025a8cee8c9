"""`gnn_policy.matmul`: the public entry to the Triton template.

It checks its arguments and says what is wrong, picks the config (the one given, or the
policy's top-1 for this shape on the local GPU), validates it against the local GPU's spec
and launches the kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys

import warnings
from pathlib import Path

import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.kernels.launch import LayoutError, launch, max_offset
from gnn_policy.kernels.matmul import ACTIVATIONS, matmul_kernel
from gnn_policy.limits import INT32_MAX, MAX_BATCH
from gnn_policy.space import TileConfig, Violation, violations

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# Triton swaps @jit functions for interpreted ones when TRITON_INTERPRET=1 at import time.
INTERPRETED = type(matmul_kernel).__name__ == "InterpretedFunction"
INTERPRETER_BF16 = "Triton's interpreter computes bf16 products wrongly (it multiplies their raw bits)"


class InvalidConfigError(ValueError):
    """The config breaks validity rules for this GPU and problem; `violations` lists them."""

    def __init__(self, config: TileConfig, gpu: str, found: list[Violation]):
        rules = "; ".join(str(v) for v in found)
        super().__init__(f"config {config.key} is invalid on {gpu}: {rules}")
        self.violations = found


@functools.lru_cache(maxsize=None)
def _detect(index: int) -> hardware_specs.GpuSpec:
    return hardware_specs.detect(index)


def gpu_for(device: torch.device) -> hardware_specs.GpuSpec:
    """The spec whose rules apply to tensors on `device`.

    $GNN_POLICY_GPU, when set, names it (for a GPU without a spec file, name the closest
    one). Otherwise a CUDA device is detected, and under Triton's interpreter (CPU tensors),
    where there is no GPU to ask, the H200's rules apply.
    """
    if os.environ.get("GNN_POLICY_GPU"):
        return hardware_specs.load(os.environ["GNN_POLICY_GPU"])
    if device.type != "cuda":
        return hardware_specs.load("h200")
    try:
        return _detect(device.index if device.index is not None else torch.cuda.current_device())
    except hardware_specs.SpecError as exc:
        raise hardware_specs.SpecError(f"{exc}; set GNN_POLICY_GPU to the closest known GPU") from None


def _check_operands(a, b) -> tuple[int, int, int, tuple[int, ...]]:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() not in (2, 3):
            raise ValueError(f"matmul: {name} must be 2-D or 3-D (batch first), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"matmul: unsupported dtype {t.dtype} for {name}; supported: "
                            f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: a is {a.dtype} but b is {b.dtype}; both must have one dtype")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: shape mismatch: a {tuple(a.shape)} has K={k} but b "
                         f"{tuple(b.shape)} has K={k2}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"matmul: batch mismatch: a has {a.shape[0]}, b has {b.shape[0]}")
    if min(m, n, k) < 1:
        raise ValueError(f"matmul: M, N and K must be >= 1, got M={m}, N={n}, K={k}")
    batches = [t.shape[0] for t in (a, b) if t.dim() == 3]
    if batches and batches[0] > MAX_BATCH:
        raise ValueError(f"matmul: batch {batches[0]} exceeds the grid limit of {MAX_BATCH}")
    out_shape = (batches[0], m, n) if batches else (m, n)
    if max(max_offset(a), max_offset(b), m * n * (batches[0] if batches else 1) - 1) > INT32_MAX:
        raise ValueError("matmul: an operand or the output spans more than 2**31 elements; the "
                         "template addresses with 32-bit offsets, so split the problem")
    return m, n, k, out_shape


def _check_extras(a, n, out_shape, bias, activation, residual) -> None:
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:
        raise ValueError(f"matmul: unknown activation {activation!r}; choose from "
                         f"{', '.join(repr(x) for x in ACTIVATIONS)}")
    for name, t in (("bias", bias), ("residual", residual)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t is not None and t.dtype != a.dtype:
            raise TypeError(f"matmul: {name} is {t.dtype} but a and b are {a.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"matmul: bias must have shape ({n},) for N={n}, got {tuple(bias.shape)}")
    if residual is not None and not _broadcasts(tuple(residual.shape), out_shape):
        raise ValueError(f"matmul: residual of shape {tuple(residual.shape)} does not broadcast "
                         f"to the output shape {out_shape}")
    if residual is not None and max_offset(residual) > INT32_MAX:
        raise ValueError("matmul: residual spans more than 2**31 elements (32-bit offsets)")


def _check_no_grad(**tensors: torch.Tensor | None) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors.values()):
        raise ValueError("matmul: the Triton template has no backward pass; call it under "
                         "torch.no_grad() (inference), or use torch.matmul where gradients are needed")


def _check_devices(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"matmul: tensors on different devices: {where}")
    device = devices["a"]
    if device.type == "cpu" and not INTERPRETED:
        raise ValueError("matmul: tensors are on the CPU; move them to a CUDA device, or set "
                         "TRITON_INTERPRET=1 before importing gnn_policy to use Triton's interpreter")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"matmul: device {device} is not supported (CUDA, or CPU under the interpreter)")
    if INTERPRETED and tensors["a"].dtype == torch.bfloat16:
        # Triton 3.6's interpreter multiplies the raw bits of bf16 in tl.dot (relative errors of 1e9):
        # a refusal, not a silently wrong product
        raise ValueError(f"matmul: {INTERPRETER_BF16}; use fp16 or fp32 under TRITON_INTERPRET=1, or bf16 "
                         "without it on a CUDA device")


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


@functools.lru_cache(maxsize=4096)
def default_config(m: int, n: int, k: int, dtype: str, gpu: hardware_specs.GpuSpec,
                   batch: int = 1) -> TileConfig:
    """The config used when none is given, until the policy picks (documented in the README).

    Small M (<= 64): a 16/32/64-row tile, 64 columns, BLOCK_K 128, and split-K doubled while
    the grid has fewer programs than SMs and each slice keeps >= 4 K tiles. Otherwise
    128x256x64 with 8 warps when both M and N are >= 2048, else 128x128x64 with 4 warps.
    TMA loads where the GPU has them. Stages drop until the config fits the GPU.
    """
    variant = "tma" if gpu.has("tma") else "ptr"
    if m <= 64:
        bm = 16 if m <= 16 else 32 if m <= 32 else 64
        bk = 128 if k >= 128 else 64 if k >= 64 else 32
        tiles = math.ceil(m / bm) * math.ceil(n / 64) * batch
        split = 1
        while split < 16 and tiles * split < gpu.sm_count and math.ceil(k / bk) >= 8 * split:
            split *= 2
        base = TileConfig(bm, 64, bk, split, 8, 4, 4, variant)
    elif m >= 2048 and n >= 2048:
        base = TileConfig(128, 256, 64, 1, 8, 8, 3, variant)
    else:
        base = TileConfig(128, 128, 64, 1, 8, 4, 4, variant)
    fallback = TileConfig(32, 32, 32, 1, 8, 4, 2, "ptr")
    for config in [dataclasses.replace(base, num_stages=s) for s in range(base.num_stages, 0, -1)] + [fallback]:
        if not violations(config, gpu, dtype, k):
            return config
    raise InvalidConfigError(fallback, gpu.name, violations(fallback, gpu, dtype, k))


POLICY_DTYPES = ("fp16", "bf16")  # the dtypes the suite, and so the policy, is trained on


def _outside_level() -> int:
    """The `stacklevel` that names the first line outside this package (the caller's, however
    many of the package's functions lie between: matmul, matmul_and_config, a patched layer)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


@functools.lru_cache(maxsize=8)
def _policy(checkpoint: str | None = None):
    """The policy of `checkpoint`, else of $GNN_POLICY_CHECKPOINT or the shipped checkpoint; None
    (warned once) if the latter is absent. A named `checkpoint` that cannot load is an error.

    Loaded on the first call that needs it: the policy imports torch_geometric, which a
    caller passing its own configs never pays for.
    """
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy

    if checkpoint is not None:
        return Policy.load(checkpoint)
    path = Path(os.environ.get("GNN_POLICY_CHECKPOINT") or DEFAULT_CHECKPOINT)
    try:
        return Policy.load(path)
    except FileNotFoundError as exc:
        warnings.warn(f"gnn_policy.matmul: {exc}; using the default configs", stacklevel=_outside_level())
        return None


@functools.lru_cache(maxsize=4096)
def policy_config(problem: GemmProblem, gpu: hardware_specs.GpuSpec,
                  checkpoint: str | None = None) -> TileConfig | None:
    """The policy's most probable valid config for `problem` on `gpu`, cached per problem;
    None when there is no checkpoint or the dtype is one the policy was not trained on.
    `checkpoint`: a path, in place of $GNN_POLICY_CHECKPOINT or the shipped one."""
    if problem.dtype not in POLICY_DTYPES:
        return None
    policy = _policy(checkpoint)
    picks = policy.top_k(problem, gpu, 1) if policy is not None else []
    return picks[0].config if picks else None


def chosen_config(problem: GemmProblem, gpu: hardware_specs.GpuSpec,
                  checkpoint: str | None = None) -> tuple[TileConfig, str]:
    """The config `matmul` runs for `problem` without one given, and where it came from:
    "policy" (its top-1) or "default" (`default_config`: fp32, or no checkpoint)."""
    picked = policy_config(problem, gpu, checkpoint)
    if picked is not None:
        return picked, "policy"
    return default_config(problem.m, problem.n, problem.k, problem.dtype, gpu, problem.batch), "default"


def _layout(t: torch.Tensor) -> str:
    return "col" if t.stride(-2) == 1 and t.stride(-1) != 1 else "row"


def matmul(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
           activation: str | None = None, residual: torch.Tensor | None = None,
           config: TileConfig | None = None) -> torch.Tensor:
    """C = act(A @ B + bias) + residual with fp32 accumulation, through the Triton template.

    a: [M, K] or [batch, M, K]; b: [K, N] or [batch, K, N] (a 2-D operand is broadcast over
    the batch); any strides. bias: [N]. residual: broadcastable to C. fp16, bf16 or fp32
    (fp32 runs on tf32 tensor cores unless torch.backends.cuda.matmul.allow_tf32 is False).
    With `config`, exactly that config runs, or an error names the rule it breaks. Without
    it, the policy's top-1 for this problem on the local GPU runs (fp16 and bf16; chosen once
    per problem, about 3 ms, plus about 0.5 s the first time per GPU and dtype); fp32, or a
    missing checkpoint, takes `default_config`. $GNN_POLICY_CHECKPOINT names another
    checkpoint, for example one that `gnn-policy finetune` adapted.
    """
    return matmul_and_config(a, b, bias=bias, activation=activation, residual=residual, config=config)[0]


def matmul_and_config(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
                      activation: str | None = None, residual: torch.Tensor | None = None,
                      config: TileConfig | None = None,
                      checkpoint: str | None = None) -> tuple[torch.Tensor, TileConfig | None]:
    """`matmul`, and the config that ran: the pick, or its pointer-load fallback where these
    tensors' alignment refuses TMA (which `chosen_config` cannot know); None for an empty batch.
    `checkpoint` picks from that policy instead of $GNN_POLICY_CHECKPOINT's or the shipped one."""
    if config is not None and not isinstance(config, TileConfig):
        raise TypeError(f"matmul: config must be a gnn_policy.TileConfig, got {type(config).__name__}")
    m, n, k, out_shape = _check_operands(a, b)
    _check_extras(a, n, out_shape, bias, activation, residual)
    _check_devices(a=a, b=b, bias=bias, residual=residual)
    _check_no_grad(a=a, b=b, bias=bias, residual=residual)
    if len(out_shape) == 3 and out_shape[0] == 0:
        return torch.empty(out_shape, dtype=a.dtype, device=a.device), None
    gpu = gpu_for(a.device)
    dtype = DTYPE_NAMES[a.dtype]
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if config is None:
        batch = out_shape[0] if len(out_shape) == 3 else 1
        problem = GemmProblem(m, n, k, batch=batch, dtype=dtype, a_layout=_layout(a), b_layout=_layout(b),
                              bias=bias is not None, activation=activation, residual=residual is not None)
        chosen, _ = chosen_config(problem, gpu, checkpoint)
        try:
            return launch(a, b, chosen, bias=bias, activation=activation, residual=residual), chosen
        except LayoutError:  # a chosen config may fall back (pointer alignment); an explicit one never does
            chosen = dataclasses.replace(chosen, variant="ptr")
            return launch(a, b, chosen, bias=bias, activation=activation, residual=residual), chosen
    found = violations(config, gpu, dtype, k)
    if found:
        raise InvalidConfigError(config, gpu.name, found)
    try:
        return launch(a, b, config, bias=bias, activation=activation, residual=residual), config
    except LayoutError as exc:
        raise InvalidConfigError(config, gpu.name, [exc.violation]) from None
