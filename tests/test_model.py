"""The policy network: a true distribution over valid configs, beam search, the cost head."""
import itertools
import math

import pytest
import torch
from torch_geometric.data import Batch

import hardware_specs
from graphs import GemmProblem
from graphs.build import problem_graph
from hardware_specs.features import GpuVocab, spec_vector
from gnn_policy.model import GEOMETRY_DIM, ModelConfig, PolicyModel, prefix_masks, problem_dims, tile_geometry
from gnn_policy.space import space, violations

H200 = hardware_specs.load("h200")
PROBLEMS = [GemmProblem(16, 4096, 4096, bias=True, activation="gelu"), GemmProblem(4096, 1024, 64, dtype="fp16")]


def _encode(model, gpu=H200):
    vocab = GpuVocab(model.cfg.gpu_names)
    graphs = Batch.from_data_list([problem_graph(p) for p in PROBLEMS])
    spec = torch.stack([spec_vector(gpu)] * len(PROBLEMS))
    idx = torch.tensor([vocab.index(gpu.name)] * len(PROBLEMS))
    masks = torch.stack([model.space.problem_mask(gpu, p) for p in PROBLEMS])
    return model.encode(graphs, spec, idx), masks


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return PolicyModel(ModelConfig(hidden=32, layers=2, gpu_names=(H200.name,))).eval()


def test_prefix_masks_say_which_prefixes_have_a_valid_completion():
    mask = torch.zeros(1, 2, 3, dtype=torch.bool)
    mask[0, 1, 2] = True
    first, second = prefix_masks(mask)
    assert first.tolist() == [[[False, True]]]
    assert second[0].tolist() == [[False, False, False], [False, False, True]]


def test_the_policy_is_a_distribution_over_exactly_the_valid_configs(model):
    h, masks = _encode(model)
    full = space("full")
    every = torch.tensor(list(itertools.product(*(range(n) for n in full.shape))))
    logp = model.log_prob(h, every[None].expand(len(PROBLEMS), -1, -1), masks)
    for b, p in enumerate(PROBLEMS):
        valid = masks[b].flatten()
        assert torch.isneginf(logp[b][~valid]).all() and torch.isfinite(logp[b][valid]).all()
        assert torch.isclose(logp[b][valid].exp().sum(), torch.tensor(1.0), atol=1e-4)
    # the mask is the space's rules: spot-check against violations()
    for flat in torch.randperm(len(every))[:200].tolist():
        config = full.at(tuple(every[flat].tolist()))
        assert bool(masks[1].flatten()[flat]) == (not violations(config, H200, "fp16", 64))


def test_beam_search_returns_valid_configs_in_probability_order(model):
    h, masks = _encode(model)
    beams, scores = model.beam_search(h, masks, k=8)
    assert beams.shape == (2, 8, 8) and (scores[:, :-1] >= scores[:, 1:]).all()
    again = model.log_prob(h, beams, masks)
    assert torch.allclose(again, scores, atol=1e-4)
    for b, p in enumerate(PROBLEMS):
        configs = [model.space.at(tuple(row)) for row in beams[b].tolist()]
        assert len(set(configs)) == 8 and not any(violations(c, H200, p.dtype, p.k) for c in configs)


def test_an_unknown_gpu_is_encoded_from_its_numbers(model):
    h_known, _ = _encode(model)
    h_b200, _ = _encode(model, hardware_specs.load("b200"))
    h_slice, _ = _encode(model, hardware_specs.load("h200-sm64"))
    assert h_known.shape == h_b200.shape == (2, 32)
    assert not torch.allclose(h_b200, h_slice)  # both 'unknown': told apart by their spec vectors


def test_cost_head_scores_each_config_and_gradients_reach_the_encoder(model):
    model.train()
    h, masks = _encode(model)
    beams, _ = model.beam_search(h, masks, k=4)
    dims = torch.stack([problem_dims(p, H200) for p in PROBLEMS])
    pred = model.cost(h, beams, dims)
    assert pred.shape == (2, 4)
    with pytest.raises(ValueError, match="tile geometry"):
        model.cost(h, beams)
    (pred.sum() - model.log_prob(h, beams, masks).sum()).backward()
    assert model.node_in.weight.grad.abs().sum() > 0 and model.hw[0].weight.grad.abs().sum() > 0
    model.eval()


def test_tile_geometry_counts_waves_and_padding():
    # 4096x4096 in 128x128 tiles on 132 SMs: 1024 tiles in 8 waves, 97% of their slots used.
    dims = problem_dims(GemmProblem(4096, 4096, 4096), H200)
    g = tile_geometry(torch.tensor([128.0, 128.0, 64.0, 1.0], dtype=torch.float64), dims)
    assert g.shape == (GEOMETRY_DIM,)
    assert g[0].item() == pytest.approx(math.log2(1024 / 132), rel=1e-6)
    assert g[1].item() == pytest.approx(1024 / (8 * 132), rel=1e-6)
    assert g[2].item() == g[3].item() == 1.0  # no padding
    assert g[4].item() == pytest.approx(6.0)  # 64 K iterations
    # M = 16 in 64-row tiles wastes three quarters; K = 100 split 4 ways is 25 per split, in one 32-wide step.
    g = tile_geometry(torch.tensor([64.0, 128.0, 32.0, 4.0], dtype=torch.float64),
                      problem_dims(GemmProblem(16, 256, 100), H200))
    assert g[2].item() == pytest.approx(0.25)
    assert g[5].item() == pytest.approx(25 / 32)
    assert g[6].item() == pytest.approx(2.0)
    assert g[0].item() == pytest.approx(math.log2(8 / 132), rel=1e-6)  # 1 x 2 tiles x 4 splits
