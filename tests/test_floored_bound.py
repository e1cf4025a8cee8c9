"""`ModelConfig.floored_bound`: a cost head bounded by the roofline with the launch floor
(`calibration.roofline_us`), bound and roofline feature both; off by default, so that every
shipped checkpoint, trained without it, scores as it did."""
import argparse
import math
import random

import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.calibration import roofline_tflops
from gnn_policy.checkpoint import model_fields, read_checkpoint
from gnn_policy.cost_features import FEATURE_COLUMNS, PROBLEM_FIELDS, analytic_features, config_values, problem_vector
from gnn_policy.model import LOG_ROOF, ModelConfig, PolicyModel, bound_dims
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy, save_checkpoint
from gnn_policy.args import add_fields, build
from tests.test_pretrain import _fake_db
from training.pretrain import PretrainArgs, run

H200 = hardware_specs.load("h200")
A100 = hardware_specs.load("a100-sxm4-80gb")

# The shipped checkpoint's three best scored configs and their predicted log TFLOP/s, taken
# with the code before `floored_bound` existed (commit 1a35360): the option must not move them.
# the default checkpoint until 2026-12-06, trained on the suite's families alone
FAMILY = DEFAULT_CHECKPOINT.parent / "pretrained-family.pt"
SHIPPED_TOP = [
    (GemmProblem(3000, 8192, 8192, b_layout="col", bias=True),
     ["bm128_bn256_bk32_sk1_gm16_w8_s4_tma", "bm256_bn128_bk64_sk1_gm4_w8_s4_tma", "bm128_bn256_bk32_sk1_gm4_w8_s4_tma"],
     [6.44908, 6.44047, 6.43984]),
    (GemmProblem(77, 1000, 333, activation="gelu"),
     ["bm64_bn16_bk64_sk1_gm1_w4_s4_ptr", "bm64_bn32_bk64_sk2_gm1_w4_s4_ptr", "bm64_bn32_bk64_sk1_gm1_w4_s4_ptr"],
     [5.08324, 5.06758, 5.05416]),
    (GemmProblem(1, 2, 56),  # tiny: the launch floor is nearly all of its bound
     ["bm16_bn64_bk16_sk4_gm16_w4_s6_ptr", "bm16_bn64_bk16_sk4_gm16_w8_s6_ptr", "bm16_bn64_bk16_sk4_gm4_w4_s6_ptr"],
     [-1.4697, -1.48941, -1.53628]),
    (GemmProblem(16, 4096, 4096, batch=4, dtype="fp16", residual=True),
     ["bm16_bn64_bk64_sk1_gm4_w2_s6_ptr", "bm16_bn64_bk64_sk1_gm16_w2_s6_ptr", "bm16_bn128_bk64_sk4_gm16_w2_s3_tma"],
     [3.76523, 3.75298, 3.75122]),
]


def _random_problem(rng: random.Random) -> GemmProblem:
    return GemmProblem(rng.choice([1, 7, 16, 100, 1000, 4096]), rng.choice([2, 64, 1000, 4096, 14336]),
                       rng.choice([16, 56, 1000, 4096]), batch=rng.choice([1, 1, 4]), dtype=rng.choice(["bf16", "fp16"]),
                       b_layout=rng.choice(["row", "col"]), bias=rng.random() < 0.5)


def test_a_checkpoint_saved_before_the_floor_existed_has_none_and_scores_as_before():
    fields = model_fields(FAMILY, read_checkpoint(FAMILY))
    assert "floored_bound" not in fields  # saved before the option: the default applies
    policy = Policy.load(FAMILY)
    assert policy.model.cfg.floored_bound is False
    for problem, keys, log_tflops in SHIPPED_TOP:
        s = policy.scores(problem, H200)
        assert [policy.model.space.points[i].key for i in s.order[:3].tolist()] == keys
        assert s.log_tflops[:3].tolist() == pytest.approx(log_tflops, abs=1e-4)


def test_the_problem_vector_carries_both_rooflines():
    p = GemmProblem(1, 2, 56)
    v = problem_vector(p, H200)
    assert v[PROBLEM_FIELDS.index("log_bound")].item() == pytest.approx(math.log(roofline_tflops(p, H200)))
    assert v[LOG_ROOF].item() == pytest.approx(math.log(roofline_tflops(p, H200, floor=False)))
    off, on = ModelConfig(cost_model=1), ModelConfig(cost_model=1, floored_bound=True)
    assert bound_dims(off, v) is v
    floored = bound_dims(on, v)
    assert floored[LOG_ROOF].item() == pytest.approx(math.log(roofline_tflops(p, H200)))
    assert torch.equal(v[LOG_ROOF], torch.tensor(math.log(roofline_tflops(p, H200, floor=False)), dtype=v.dtype))
    # the roofline feature (log roofline over log peak) reads the floored bound too
    values = config_values(PolicyModel(on).space)[:1]
    column = FEATURE_COLUMNS["problem"][4]  # `problem_features`: log_roofline - log_peak
    roof_feature = [analytic_features(values, d)[0, column].item() for d in (v, floored)]
    assert roof_feature[1] < roof_feature[0] - 5  # 2.5 us of floor against nanoseconds of work


def test_floored_bound_needs_the_bounded_cost_head():
    with pytest.raises(ValueError, match="cost_model 1"):
        ModelConfig(cost_model=0, floored_bound=True)


@pytest.mark.parametrize("floored", [False, True])
def test_no_prediction_exceeds_the_models_bound(floored):
    """With the option, no prediction exceeds the roofline with the floor, which is what a
    user's figure is capped at; a head at full efficiency reaches it exactly."""
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), cost_model=1,
                                    floored_bound=floored)).eval()
    with torch.no_grad():  # an efficiency as high as a sigmoid gets
        model.cost_head[2].bias.fill_(30.0)
    policy, rng = Policy(model), random.Random(0)
    for _ in range(10):
        p = _random_problem(rng)
        for gpu in (H200, A100):
            bound = roofline_tflops(p, gpu, floor=floored)
            top = policy.scores(p, gpu).log_tflops.exp().max().item()
            assert top <= bound * (1 + 1e-5) and top == pytest.approx(bound, rel=1e-4)
            picks = policy.top_k(p, gpu, 4)
            assert picks and all(x.predicted_tflops <= bound * (1 + 1e-5) for x in picks)


def test_a_floored_model_scores_as_config_by_config_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), cost_model=1, floored_bound=True))
    save_checkpoint(model, tmp_path / "f.pt")
    policy = Policy.load(tmp_path / "f.pt")
    assert policy.model.cfg.floored_bound is True
    for problem in (GemmProblem(1, 2, 56), GemmProblem(77, 1000, 333, activation="gelu")):
        h, mask = policy.encode(problem, H200)
        flat = mask.flatten().nonzero().squeeze(1)
        index = torch.stack(torch.unravel_index(flat, policy.model.space.shape), -1)
        with torch.no_grad():
            slow = policy.cost(h, problem, H200, index[None])[0]
        s = policy.scores(problem, H200)
        assert torch.allclose(s.by_flat[flat], slow, rtol=0, atol=1e-5)


def test_pretrain_flag_reaches_the_checkpoint(tmp_path):
    parser = argparse.ArgumentParser()
    add_fields(parser, PretrainArgs)
    assert build(PretrainArgs, vars(parser.parse_args([]))).floored_bound is False
    assert build(PretrainArgs, vars(parser.parse_args(["--floored-bound"]))).floored_bound is True
    _fake_db(tmp_path / "m.sqlite")
    card = run(PretrainArgs(db=str(tmp_path / "m.sqlite"), epochs=1, batch_size=3, hidden=16, layers=1,
                            out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"), wandb=False,
                            floored_bound=True))
    assert card["model_config"]["floored_bound"] is True and card["args"]["floored_bound"] is True
    assert Policy.load(tmp_path / "ckpt" / "pretrained.pt").model.cfg.floored_bound is True


def test_the_default_checkpoint_is_floored_and_was_trained_on_random_shapes():
    import json

    policy = Policy.load(DEFAULT_CHECKPOINT)
    assert policy.model.cfg.floored_bound is True
    card = json.loads(DEFAULT_CHECKPOINT.with_suffix(".card.json").read_text())
    # an ensemble's card lists its members' training cards, one per member
    runs = card["members"] if card.get("job") == "ensemble" else [card]
    assert len(runs) == 1 + len(policy.members)
    for run in runs:
        assert run["data"]["train"]["problems_by_split"]["random-train"] > 0
        assert "random-test" not in run["data"]["train"]["problems_by_split"]
