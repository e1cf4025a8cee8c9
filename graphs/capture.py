"""`capture(module, example_inputs)`: the GEMMs of a real torch module, with their epilogues.

Traces the module with torch.fx, propagates the example inputs' shapes, and turns each
linear / matmul / bmm / addmm into a GemmProblem. The element-wise ops that follow a GEMM and
that the template fuses are folded in, in the template's order: bias, then one activation
(relu, gelu, silu), then a residual add. The ops around each GEMM are kept as its graph
context (what feeds it, what consumes it), which the policy's graph encoder reads.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

from graphs.problem import GemmProblem

_ACTIVATIONS = {F.relu: "relu", torch.relu: "relu", F.gelu: "gelu", F.silu: "silu",
                torch.nn.ReLU: "relu", torch.nn.GELU: "gelu", torch.nn.SiLU: "silu"}
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_GEMM_FUNCS = {torch.matmul: "matmul", operator.matmul: "matmul", torch.bmm: "bmm",
               torch.mm: "matmul", F.linear: "linear", torch.addmm: "addmm"}


@dataclasses.dataclass(frozen=True)
class CapturedGemm:
    """A GEMM found in a module: the problem, and the fx nodes around it."""

    problem: GemmProblem
    node: str
    producers: tuple[str, ...]
    consumers: tuple[str, ...]


def _op_name(node: torch.fx.Node, modules: dict) -> str:
    if node.op == "call_module":
        return type(modules[node.target]).__name__
    if node.op in ("call_function", "call_method"):
        return getattr(node.target, "__name__", str(node.target))
    return node.op


def _activation(node: torch.fx.Node, modules: dict) -> str | None:
    if node.op == "call_module":
        return _ACTIVATIONS.get(type(modules[node.target]))
    if node.op == "call_function":
        return _ACTIVATIONS.get(node.target)
    return None


def _is_add(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target in (operator.add, torch.add)) or \
        (node.op == "call_method" and node.target == "add")


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _gemm_shape(node: torch.fx.Node, modules: dict) -> tuple[int, int, int, int, bool] | None:
    """(batch, M, N, K, has_bias) of a GEMM node, from the propagated shapes; None if not one."""
    is_linear = node.op == "call_module" and isinstance(modules[node.target], torch.nn.Linear)
    kind = _GEMM_FUNCS.get(node.target) if node.op == "call_function" else None
    meta = node.meta.get("tensor_meta")
    if not (is_linear or kind) or not hasattr(meta, "shape"):
        return None
    out = tuple(meta.shape)
    if is_linear:
        lin = modules[node.target]
        rows = int(torch.tensor(out[:-1]).prod()) if len(out) > 1 else 1
        return 1, rows, lin.out_features, lin.in_features, lin.bias is not None
    first = node.args[1] if kind == "addmm" else node.args[0]
    k = first.meta["tensor_meta"].shape[-1]
    if kind == "linear":
        rows = int(torch.tensor(out[:-1]).prod()) if len(out) > 1 else 1
        return 1, rows, out[-1], k, len(node.args) > 2 and node.args[2] is not None
    batch = int(torch.tensor(out[:-2]).prod()) if len(out) > 2 else 1
    return batch, out[-2], out[-1], k, kind == "addmm"


def capture(module: torch.nn.Module, example_inputs: tuple) -> list[CapturedGemm]:
    """Every GEMM of `module` on these inputs, in graph order."""
    gm = torch.fx.symbolic_trace(module)
    ShapeProp(gm).propagate(*example_inputs)
    modules = dict(gm.named_modules())
    found = []
    for node in gm.graph.nodes:
        shape = _gemm_shape(node, modules)
        if shape is None:
            continue
        batch, m, n, k, bias = shape
        last, activation, residual = node, None, False
        nxt = _only_user(last)
        if nxt is not None and _activation(nxt, modules):
            activation, last = _activation(nxt, modules), nxt
            nxt = _only_user(last)
        if nxt is not None and _is_add(nxt):
            residual, last = True, nxt
        dtype = _DTYPES.get(node.meta["tensor_meta"].dtype, "fp32")
        problem = GemmProblem(m, n, k, batch=batch, dtype=dtype, bias=bias, activation=activation,
                              residual=residual, model=type(module).__name__,
                              layer=str(node.target) if node.op == "call_module" else node.name)
        producers = tuple(_op_name(a, modules) for a in node.all_input_nodes)
        consumers = tuple(_op_name(u, modules) for u in last.users)
        found.append(CapturedGemm(problem, node.name, producers, consumers))
    return found
