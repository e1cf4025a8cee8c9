"""Problem graphs: structure per epilogue, features that decode back, PyG batching."""
import math

import torch
from torch_geometric.data import Batch

from graphs import GemmProblem
from graphs.build import EDGE_DIM, KINDS, NODE_DIM, problem_graph


def _kinds(g):
    return [KINDS[i] for i in g.x[:, :len(KINDS)].argmax(1).tolist()]


def test_nodes_follow_the_epilogue():
    plain = problem_graph(GemmProblem(64, 128, 256))
    assert _kinds(plain) == ["A", "B", "gemm", "output"]
    full = problem_graph(GemmProblem(64, 128, 256, bias=True, activation="silu", residual=True), ["mul"], ["add"])
    assert _kinds(full) == ["A", "B", "gemm", "bias", "activation", "residual", "add", "output", "context", "context"]
    assert full.x.shape == (10, NODE_DIM) and full.edge_attr.shape[1] == EDGE_DIM
    # every edge runs both ways, the reversed copy flagged
    assert full.edge_index.shape[1] == 2 * 9 and full.edge_attr[:, -1].sum() == 9


def test_features_decode_back_to_the_problem():
    p = GemmProblem(3000, 4096, 14336, batch=4, dtype="fp16", a_layout="col", activation="gelu")
    g = problem_graph(p)
    gemm = g.x[_kinds(g).index("gemm")]
    o = len(KINDS)
    m, n, batch, k = (round(2 ** (16 * v.item()) - 1) for v in gemm[o:o + 4])
    assert (m, n, batch, k) == (3000, 4096, 4, 14336)
    assert gemm[o + 4:o + 7].tolist() == [1.0, 0.0, 0.0]  # fp16
    a = g.x[0]
    assert a[o + 7] == 1.0 and g.x[1][o + 7] == 0.0  # A column-major, B row-major
    assert a[o + 8] == 0.0 and a[o + 10] == 1.0  # 3000 rows not a multiple of 16, K is
    act = g.x[_kinds(g).index("activation")]
    assert act[o + 11:o + 14].tolist() == [0.0, 1.0, 0.0]  # gelu
    assert math.isclose(gemm[-1].item(), math.log2(p.flops / p.bytes_min()) / 12, rel_tol=1e-6)


def test_graphs_batch_with_pyg():
    graphs = [problem_graph(GemmProblem(m, 4096, 4096, bias=m % 2 == 0)) for m in (1, 2, 3)]
    batch = Batch.from_data_list(graphs)
    assert batch.num_graphs == 3 and batch.x.shape[0] == sum(g.num_nodes for g in graphs)
    assert batch.key == [g.key for g in graphs]
    assert torch.equal(batch.batch.bincount(), torch.tensor([g.num_nodes for g in graphs]))
