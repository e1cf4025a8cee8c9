"""A GemmProblem as the graph the policy's GNN reads (a PyG `Data`).

Nodes are the tensors and ops of the computation, edges follow the data flow (each edge also
runs backwards, flagged, so messages reach the inputs). Every node has the same feature
columns; a column that does not apply to a node is 0.

| columns | node feature | encoding |
|---|---|---|
| 0-8 | node kind: A, B, gemm, bias, activation, residual, add, output, context | one-hot |
| 9-12 | rows, cols, batch, K of the node's tensor (gemm node: M, N, batch, K) | log2(x + 1) / 16 |
| 13-15 | dtype fp16, bf16, fp32 | one-hot |
| 16 | stored column-major (its rows are the contiguous dimension) | 0 / 1 |
| 17-19 | rows, cols, K divisible by 16 (what Triton specialises on; TMA needs 16-byte rows) | 0 / 1 |
| 20-22 | activation relu, gelu, silu (activation node) | one-hot |
| 23 | arithmetic intensity of the whole GEMM, log2(FLOP / min bytes) / 12 (gemm node) | scalar |

| columns | edge feature | encoding |
|---|---|---|
| 0-5 | role: operand A, operand B, bias, activation, residual, output | one-hot |
| 6 | reversed edge (consumer to producer) | 0 / 1 |

`context` nodes are the neighbouring ops that `graphs.capture` recorded (a producer feeding
A, a consumer of the output), so a captured GEMM carries its surroundings.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch_geometric.data import Data

from graphs.problem import GemmProblem

KINDS = ("A", "B", "gemm", "bias", "activation", "residual", "add", "output", "context")
ROLES = ("A", "B", "bias", "activation", "residual", "output")
DTYPES = ("fp16", "bf16", "fp32")
ACTIVATIONS = ("relu", "gelu", "silu")
NODE_DIM = len(KINDS) + 4 + len(DTYPES) + 1 + 3 + len(ACTIVATIONS) + 1
EDGE_DIM = len(ROLES) + 1


def _log(x: int) -> float:
    return math.log2(x + 1) / 16


def _node(kind: str, p: GemmProblem, rows: int = 0, cols: int = 0, *, col_major: bool = False,
          activation: str | None = None) -> list[float]:
    f = [0.0] * NODE_DIM
    f[KINDS.index(kind)] = 1.0
    o = len(KINDS)
    f[o:o + 4] = [_log(rows), _log(cols), _log(p.batch), _log(p.k)]
    f[o + 4 + DTYPES.index(p.dtype)] = 1.0
    o += 4 + len(DTYPES)
    f[o] = float(col_major)
    f[o + 1:o + 4] = [float(rows % 16 == 0), float(cols % 16 == 0), float(p.k % 16 == 0)]
    if activation:
        f[o + 4 + ACTIVATIONS.index(activation)] = 1.0
    if kind == "gemm":
        f[-1] = math.log2(p.flops / p.bytes_min()) / 12
    return f


def problem_graph(problem: GemmProblem, producers: Sequence[str] = (), consumers: Sequence[str] = ()) -> Data:
    """The computation graph of `problem`, plus a `context` node per op feeding A (`producers`)
    and per op reading the output (`consumers`), as `graphs.capture` reports them.

    Returns `Data(x [nodes, NODE_DIM], edge_index [2, edges], edge_attr [edges, EDGE_DIM])`
    with the problem's key in `key`.
    """
    p = problem
    nodes = [_node("A", p, p.m, p.k, col_major=p.a_layout == "col"),
             _node("B", p, p.k, p.n, col_major=p.b_layout == "col"),
             _node("gemm", p, p.m, p.n)]
    edges = [(0, 2, "A"), (1, 2, "B")]
    last = 2
    if p.bias:
        nodes.append(_node("bias", p, 1, p.n))
        edges.append((len(nodes) - 1, last, "bias"))
    if p.activation:
        nodes.append(_node("activation", p, p.m, p.n, activation=p.activation))
        edges.append((last, len(nodes) - 1, "activation"))
        last = len(nodes) - 1
    if p.residual:
        nodes.append(_node("residual", p, p.m, p.n))
        nodes.append(_node("add", p, p.m, p.n))
        edges += [(len(nodes) - 2, len(nodes) - 1, "residual"), (last, len(nodes) - 1, "residual")]
        last = len(nodes) - 1
    nodes.append(_node("output", p, p.m, p.n))
    out = len(nodes) - 1
    edges.append((last, out, "output"))
    for _ in producers:
        nodes.append(_node("context", p))
        edges.append((len(nodes) - 1, 0, "A"))
    for _ in consumers:
        nodes.append(_node("context", p))
        edges.append((out, len(nodes) - 1, "output"))
    src, dst, attr = [], [], []
    for a, b, role in edges:
        for s, d, rev in ((a, b, 0.0), (b, a, 1.0)):
            src.append(s)
            dst.append(d)
            e = [0.0] * EDGE_DIM
            e[ROLES.index(role)] = 1.0
            e[-1] = rev
            attr.append(e)
    return Data(x=torch.tensor(nodes), edge_index=torch.tensor([src, dst]),
                edge_attr=torch.tensor(attr), key=p.key)
