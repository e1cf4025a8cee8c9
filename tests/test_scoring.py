"""Scoring every valid config (gnn_policy.scoring) against the cost head run config by config."""
import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy import scoring
from gnn_policy.cost_features import problem_vector
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy, diverse_order

H200 = hardware_specs.load("h200")
A100 = hardware_specs.load("a100-sxm4-80gb")
SHAPES = [
    GemmProblem(3000, 8192, 8192, b_layout="col", bias=True),  # aligned: every config of the GPU valid
    GemmProblem(77, 1000, 333, activation="gelu"),  # odd sizes: no TMA, narrow pointer loads
    GemmProblem(16, 4096, 4096, batch=4, dtype="fp16", residual=True),  # batched
    GemmProblem(8192, 8192, 16, a_layout="col"),  # K of one tile: SPLIT_K 1 only
    GemmProblem(100, 1000, 4096, dtype="fp32", b_layout="col", activation="silu"),
]


def _straightforward(policy: Policy, problem: GemmProblem, gpu) -> torch.Tensor:
    """Predicted log TFLOP/s by flat index through `PolicyModel.cost`, -inf for invalid configs."""
    h, mask = policy.encode(problem, gpu)
    flat = mask.flatten().nonzero().squeeze(1)
    index = torch.stack(torch.unravel_index(flat, policy.model.space.shape), -1)
    with torch.no_grad():
        pred = torch.cat([policy.cost(h, problem, gpu, index[None, i:i + 8192])[0] for i in range(0, len(index), 8192)])
    return torch.full((mask.numel(),), float("-inf")).index_put_((flat,), pred)


def _assert_scored_as_config_by_config(policy: Policy, problem: GemmProblem, gpu, k: int = 8) -> None:
    slow = _straightforward(policy, problem, gpu)
    s = policy.scores(problem, gpu)
    valid = torch.isfinite(slow)
    assert torch.equal(torch.isfinite(s.by_flat), valid)  # every valid config is scored, no other
    assert torch.allclose(s.by_flat[valid], slow[valid], rtol=0, atol=1e-5)
    order = slow.topk(min(256, int(valid.sum()))).indices
    assert s.order[:k].tolist() == order[:k].tolist()
    configs = [policy.model.space.points[i] for i in order.tolist()]
    assert [x.config for x in policy.top_k(problem, gpu, k)] == [configs[i] for i in diverse_order(configs, k)]


@pytest.mark.parametrize("gpu", [H200, A100], ids=["h200", "a100"])
def test_the_shipped_policy_picks_and_scores_as_its_cost_head_config_by_config(gpu):
    # one model's scoring (the default is a vote of seeds: tests/test_ensemble.py checks the vote)
    policy = Policy.load(DEFAULT_CHECKPOINT).first()
    assert policy.model.cfg.cost_model == 1
    for problem in SHAPES:
        _assert_scored_as_config_by_config(policy, problem, gpu)


@pytest.mark.parametrize("cost_features", [True, False])
def test_a_small_bounded_model_scores_as_config_by_config(cost_features):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), cost_model=1,
                                    cost_features=cost_features))
    policy = Policy(model)
    for problem in SHAPES[:3]:
        _assert_scored_as_config_by_config(policy, problem, H200)


def test_a_config_table_serves_only_the_gpu_and_dtype_it_was_built_for():
    model = PolicyModel(ModelConfig(hidden=16, layers=1, cost_model=1)).eval()
    p = GemmProblem(64, 64, 64)
    table = scoring.config_table(model, model.space.mask(H200, "bf16"), problem_vector(p, H200))
    assert len(table.flat) == model.space.mask(H200, "bf16").sum()  # the rows times GROUP_M: every valid config
    h, mask = Policy(model).encode(p, A100)
    with pytest.raises(ValueError, match="another GPU or dtype"):
        scoring.score_all(model, table, h, problem_vector(p, A100), mask[0])


def test_scoring_runs_on_the_threads_asked_for_and_restores_torchs(monkeypatch):
    before = torch.get_num_threads()
    seen = []
    for value, expected in (("1", 1), ("2", 2), ("0", before)):
        monkeypatch.setenv(scoring.THREADS, value)
        with scoring.scoring_threads():
            seen.append(torch.get_num_threads())
        assert torch.get_num_threads() == before
        assert seen[-1] == expected
    monkeypatch.delenv(scoring.THREADS)
    with scoring.scoring_threads():
        assert torch.get_num_threads() == 1  # the default
