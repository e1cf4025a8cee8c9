"""`capture(module, example_inputs)`: the GEMMs of a real torch module, with their epilogues.

Traces the module with torch.fx, propagates the example inputs' shapes, and turns each
linear / matmul / bmm / addmm into a GemmProblem. The element-wise ops that follow a GEMM and
that the template fuses are folded in, in the template's order: bias, then one activation
(relu, exact gelu, silu), then a residual add. The ops around each GEMM are kept as its graph
context (what feeds it, what consumes it), which the policy's graph encoder reads. Layouts are
the operands' as stored: an `nn.Linear` weight ([out, in], contiguous) is a column-major B.

`capture_model` also lists what holds GEMMs the template cannot run: leaf modules such as
convolutions or `nn.MultiheadAttention` (fx does not trace into torch.nn's own modules),
`scaled_dot_product_attention`, and GEMMs in dtypes other than fp16, bf16 and fp32.
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
# torch.nn modules that run GEMMs of their own, out of the template's reach
_OPAQUE = (torch.nn.modules.conv._ConvNd, torch.nn.MultiheadAttention, torch.nn.Bilinear,
           torch.nn.RNNBase, torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)
_OPAQUE_FUNCS = {F.scaled_dot_product_attention: "attention: its GEMMs run inside the attention kernel"}
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
    """The template's name for an activation node; None for others (a tanh-approximated GELU too)."""
    if node.op == "call_module":
        module = modules[node.target]
        exact = getattr(module, "approximate", "none") == "none"
        return _ACTIVATIONS.get(type(module)) if exact else None
    if node.op == "call_function" and node.kwargs.get("approximate", "none") == "none":
        return _ACTIVATIONS.get(node.target)
    return None


def _is_add(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target in (operator.add, torch.add)) or \
        (node.op == "call_method" and node.target == "add")


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def epilogue_chain(node: torch.fx.Node, modules: dict) -> tuple[str | None, torch.fx.Node | None, torch.fx.Node | None]:
    """(activation, activation node, residual add node) that follow a GEMM node and fold into it."""
    act_node = add_node = None
    nxt = _only_user(node)
    if nxt is not None and _activation(nxt, modules):
        act_node = nxt
        nxt = _only_user(nxt)
    if nxt is not None and _is_add(nxt):
        add_node = nxt
    return (_activation(act_node, modules) if act_node else None), act_node, add_node


def _stored_layout(arg: object) -> str:
    meta = getattr(arg, "meta", {}).get("tensor_meta")
    stride = getattr(meta, "stride", None)
    if not stride or len(stride) < 2:
        return "row"
    return "col" if stride[-2] == 1 and stride[-1] != 1 else "row"


def _layouts(node: torch.fx.Node) -> tuple[str, str]:
    """(a_layout, b_layout) of a GEMM node as its operands are stored."""
    if node.op == "call_module" or node.target is F.linear:
        return _stored_layout(node.args[0]), "col"
    a, b = (node.args[1], node.args[2]) if node.target is torch.addmm else node.args[:2]
    return _stored_layout(a), _stored_layout(b)


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


def _layer(node: torch.fx.Node) -> str:
    return str(node.target) if node.op == "call_module" else node.name


def capture_model(module: torch.nn.Module, example_inputs: tuple) -> tuple[list[CapturedGemm], list[tuple[str, str]]]:
    """Every GEMM of `module` on these inputs, in graph order, and (layer, why) for the GEMMs
    the template cannot run."""
    gm = torch.fx.symbolic_trace(module)
    ShapeProp(gm).propagate(*example_inputs)
    modules = dict(gm.named_modules())
    found, skipped = [], []
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(modules[node.target], _OPAQUE):
            skipped.append((_layer(node), f"{type(modules[node.target]).__name__}: its GEMMs run inside the module"))
        if node.op == "call_function" and node.target in _OPAQUE_FUNCS:
            skipped.append((_layer(node), _OPAQUE_FUNCS[node.target]))
        shape = _gemm_shape(node, modules)
        if shape is None:
            continue
        dtype = _DTYPES.get(node.meta["tensor_meta"].dtype)
        if dtype is None:
            skipped.append((_layer(node), f"dtype {node.meta['tensor_meta'].dtype}: the template runs fp16, bf16, fp32"))
            continue
        batch, m, n, k, bias = shape
        activation, act_node, add_node = epilogue_chain(node, modules)
        a_layout, b_layout = _layouts(node)
        problem = GemmProblem(m, n, k, batch=batch, dtype=dtype, a_layout=a_layout, b_layout=b_layout, bias=bias,
                              activation=activation, residual=add_node is not None,
                              model=type(module).__name__, layer=_layer(node))
        last = add_node or act_node or node
        producers = tuple(_op_name(a, modules) for a in node.all_input_nodes)
        consumers = tuple(_op_name(u, modules) for u in last.users)
        found.append(CapturedGemm(problem, node.name, producers, consumers))
    return found, skipped


def capture(module: torch.nn.Module, example_inputs: tuple) -> list[CapturedGemm]:
    """Every GEMM of `module` on these inputs that the template can run, in graph order."""
    return capture_model(module, example_inputs)[0]
