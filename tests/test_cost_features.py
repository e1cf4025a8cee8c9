"""The roofline-bounded cost model: its features, its bound, and scores that follow its weights
(scoring every valid config: tests/test_scoring.py)."""
import math
import random

import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.calibration import roofline_tflops
from gnn_policy.cost_features import (CONFIG_FIELDS, FEATURE_COLUMNS, FEATURE_DIM, PROBLEM_FIELDS, analytic_features,
                                      config_values, problem_vector)
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import Policy
from gnn_policy.space import TileConfig, resident_programs, space

H200 = hardware_specs.load("h200")
FULL = space("full")


def _random_problem(rng: random.Random) -> GemmProblem:
    return GemmProblem(rng.choice([1, 7, 16, 100, 1000, 4096, 8192]), rng.choice([8, 64, 1000, 4096, 14336]),
                       rng.choice([16, 100, 1000, 4096]), batch=rng.choice([1, 1, 4]), dtype=rng.choice(["bf16", "fp16"]),
                       a_layout=rng.choice(["row", "col"]), b_layout=rng.choice(["row", "col"]),
                       bias=rng.random() < 0.5, activation=rng.choice([None, "relu", "gelu"]),
                       residual=rng.random() < 0.3)


def _features(problem: GemmProblem, config: TileConfig) -> dict[str, float]:
    values = config_values(FULL)[FULL.points.index(config)]
    return dict(enumerate(analytic_features(values, problem_vector(problem, H200)).tolist()))


def test_the_problem_vector_carries_the_roofline_of_the_work():
    """Without the launch floor: the roofline the shipped checkpoints were trained on."""
    p = GemmProblem(16, 4096, 4096, bias=True, activation="gelu")
    v = problem_vector(p, H200)
    log_roof = v[PROBLEM_FIELDS.index("log_roofline")].item()
    assert log_roof == pytest.approx(math.log(roofline_tflops(p, H200, floor=False)))
    assert log_roof > math.log(roofline_tflops(p, H200)) + 0.2  # 7.0 us of traffic, 2.5 us of floor
    assert v[:5].tolist() == [1, 16, 4096, 4096, H200.sm_count]  # problem_dims, what cost_model 0 reads


def test_pointer_loads_narrow_on_unaligned_rows_and_tma_does_not():
    # rows of 1000 bf16 elements: TMA boxes stay 16 bytes wide; pointer loads fall to one element
    ptr, tma = TileConfig(128, 128, 64), TileConfig(128, 128, 64, variant="tma")
    a_width, b_width = 7, 8  # FEATURE indices after the 7 geometry features: log2(bytes) / 4
    odd, even = GemmProblem(1000, 1000, 1000), GemmProblem(1024, 1024, 1024)
    assert _features(odd, ptr)[a_width] == pytest.approx(math.log2(2) / 4)
    assert _features(odd, tma)[a_width] == _features(even, ptr)[a_width] == pytest.approx(1.0)
    # a column-major B is read along K: K = 1024 keeps its loads wide even though N = 1000 does not
    assert _features(GemmProblem(1000, 1000, 1024, b_layout="col"), ptr)[b_width] == pytest.approx(1.0)
    assert _features(GemmProblem(1000, 1000, 1024), ptr)[b_width] == pytest.approx(0.25)


def test_occupancy_uses_the_resource_model_of_the_space():
    for config in (TileConfig(64, 64, 32, num_stages=2), TileConfig(128, 256, 64, num_warps=8, num_stages=4)):
        smem = config.smem_bytes("bf16")
        resident = resident_programs(smem, config.num_warps, H200.smem_per_sm_bytes, H200.max_threads_per_sm)
        feats = _features(GemmProblem(4096, 4096, 4096), config)
        assert feats[12] == pytest.approx(math.log2(resident) / 2)  # log2 programs an SM holds
        assert feats[11] == pytest.approx(smem / H200.smem_per_sm_bytes)


def test_the_features_read_what_scoring_computes_them_from():
    values = config_values(FULL).float()
    a, b = GemmProblem(100, 1000, 4096, b_layout="col"), GemmProblem(4096, 14336, 16, bias=True, activation="gelu")
    fa, fb = (analytic_features(values, problem_vector(p, H200).float()) for p in (a, b))
    assert fa.shape == (len(FULL), FEATURE_DIM) and torch.isfinite(fa).all()
    # not GROUP_M: configs that differ in it alone have the same features
    by_group = fa.reshape(*FULL.shape, FEATURE_DIM).movedim(CONFIG_FIELDS.index("group_m"), 0)
    assert all(torch.equal(by_group[0], g) for g in by_group[1:])
    # the resource group reads only the GPU and the dtype of a problem: one table serves all
    resources = list(FEATURE_COLUMNS["resources"])
    assert torch.equal(fa[:, resources], fb[:, resources]) and not torch.equal(fa, fb)
    assert sorted(c for cols in FEATURE_COLUMNS.values() for c in cols) == list(range(FEATURE_DIM))


def test_no_prediction_exceeds_the_roofline():
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), cost_model=1)).eval()
    with torch.no_grad():  # an efficiency as high as a sigmoid gets: the bound must still hold
        model.cost_head[2].bias.fill_(30.0)
    rng = random.Random(0)
    policy = Policy(model)
    for _ in range(12):
        p = _random_problem(rng)
        for gpu in (H200, hardware_specs.load("a100-sxm4-80gb")):
            roof = roofline_tflops(p, gpu, floor=False)  # the head's bound: the work's (see cost_features)
            s = policy.scores(p, gpu)
            assert s.log_tflops.exp().max().item() <= roof * (1 + 1e-5)
            picks = policy.top_k(p, gpu, 4)
            assert picks and all(x.predicted_tflops <= roof * (1 + 1e-5) for x in picks)


def test_the_config_table_follows_the_weights():
    torch.manual_seed(1)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, cost_model=1))
    policy = Policy(model)
    p = GemmProblem(16, 4096, 4096)
    before = policy.scores(p, H200).log_tflops.clone()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    h, _ = policy.encode(p, H200)
    policy.cost(h, p, H200, torch.zeros(1, 3, len(FULL.shape), dtype=torch.long)).sum().backward()
    optimiser.step()  # as fine-tuning does: in place, between calls
    after = policy.scores(p, H200)
    assert not torch.allclose(before, after.log_tflops)
    h, mask = policy.encode(p, H200)
    with torch.no_grad():
        flat = after.order[:5]
        idx = torch.stack(torch.unravel_index(flat, FULL.shape), -1)
        assert torch.allclose(after.log_tflops[:5], policy.cost(h, p, H200, idx[None])[0], atol=1e-4)
