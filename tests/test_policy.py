"""Inference: checkpoint round trip, top-k, ranking, the triton.autotune pruner, the tune CLI."""
import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

import hardware_specs
from graphs import GemmProblem
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import (COST_WEIGHT, DEFAULT_CHECKPOINT, RERANK, TEMPERATURE, Policy, autotune_pruner,
                               diversity_group)
from gnn_policy.space import NAMED_LISTS, TileConfig, violations

H200 = hardware_specs.load("h200")
P = GemmProblem(16, 4096, 4096, bias=True, activation="gelu")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,)))
    path = tmp_path_factory.mktemp("ckpt") / "p.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return path


def test_top_k_are_valid_distinct_and_ordered(checkpoint):
    policy = Policy.load(checkpoint)
    picks = policy.top_k(P, H200, 8)
    assert len(picks) == 8 and len({p.config for p in picks}) == 8
    assert all(not violations(p.config, H200, P.dtype, P.k) for p in picks)
    assert all(p.predicted_tflops > 0 for p in picks)
    # the first pick: the best of the RERANK most probable by log p + COST_WEIGHT log TFLOP/s; the rest by probability
    probable = sorted(policy.top_k(P, H200, RERANK), key=lambda p: -p.probability)
    score = lambda p: math.log(p.probability) + COST_WEIGHT * math.log(p.predicted_tflops)  # noqa: E731
    assert len(probable) == RERANK and picks[0] == max(probable, key=score)
    assert [p for p in probable if p != picks[0]][:7] == picks[1:]
    assert policy.top_k(P, H200, 1) == picks[:1]
    ranked = policy.rank(P, H200, [p.config for p in reversed(picks)])
    by_probability = sorted(picks, key=lambda p: -p.probability)
    assert [c for c, _ in ranked] == [p.config for p in by_probability]
    assert [pr for _, pr in ranked] == pytest.approx([p.probability for p in by_probability], rel=1e-4)


def test_a_missing_checkpoint_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="gnn-policy pretrain"):
        Policy.load(tmp_path / "none.pt")


@triton.jit
def _write_block_m(out, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, USE_TMA: tl.constexpr):
    tl.store(out, BLOCK_M * 1000 + BLOCK_N)


def test_autotune_benchmarks_only_the_policys_favourites(checkpoint):
    policy = Policy.load(checkpoint)
    configs = [c.to_triton() for c in NAMED_LISTS["triton_tutorial"]]
    timed = []

    def equal_times(fn, quantiles=None, **_):  # the interpreter has no timer: run once, tie
        fn()
        timed.append(1)
        return [1.0, 1.0, 1.0]

    tuned = triton.autotune(configs=configs, key=["M"], do_bench=equal_times, prune_configs_by=autotune_pruner(
        policy, 2, H200, lambda args: GemmProblem(args["M"], 4096, 4096)))(_write_block_m)
    out = torch.zeros(1, dtype=torch.int32)
    tuned[(1,)](out, 16)
    best, _ = policy.rank(GemmProblem(16, 4096, 4096), H200, list(NAMED_LISTS["triton_tutorial"]))[0]
    assert len(timed) == 2  # 2 of the list's 16 configs were benchmarked
    assert out.item() == best.block_m * 1000 + best.block_n  # the tie goes to the policy's first


def test_tune_cli_prints_json_picks(checkpoint):
    res = subprocess.run([sys.executable, "-m", "gnn_policy.cli", "tune", "--m", "16", "--n", "4096", "--k", "4096",
                          "--bias", "--activation", "gelu", "--top-k", "4", "--gpu", "h200", "--json",
                          "--checkpoint", str(checkpoint)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["problem"] == P.key and len(out["picks"]) == 4 and out["prediction_ms"] > 0
    for pick in out["picks"]:  # the time and the rate shown are one prediction, within rounding
        assert TileConfig(**pick["fields"]).key == pick["config"]
        assert 0 < pick["predicted_tflops"] <= out["roofline_tflops"]
        assert pick["predicted_us"] * pick["predicted_tflops"] * 1e6 == pytest.approx(P.flops, rel=2e-3)


def test_the_pruner_reads_keyword_arguments_and_puts_ruled_out_configs_last(checkpoint):
    from gnn_policy.space import TileConfig

    policy = Policy.load(checkpoint)
    ruled_out = TileConfig(128, 128, 64, split_k=16).to_triton()  # SPLIT_K 16 > the 1 K tile of K=64
    fine = TileConfig(64, 64, 32).to_triton()
    prune = autotune_pruner(policy, 1, H200, lambda a: GemmProblem(a["M"], 256, 64))["early_config_prune"]
    assert prune([ruled_out, fine], {"out": None}, M=16) == [fine]


def test_a_checkpoint_saved_before_the_tile_geometry_loads_and_ranks(tmp_path):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), geometry=False))
    config = dataclasses.asdict(model.cfg)
    del config["geometry"]  # what such a checkpoint holds
    torch.save({"model_config": config, "state_dict": model.state_dict()}, tmp_path / "old.pt")
    policy = Policy.load(tmp_path / "old.pt")
    assert not policy.model.cfg.geometry
    picks = policy.top_k(P, H200, 4)
    assert len(picks) == 4 and all(p.predicted_tflops > 0 for p in picks)
    # a model with the geometry has a cost head wider by the geometry features
    new = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,)))
    assert new.cost_head[0].in_features == model.cost_head[0].in_features + 7


@pytest.fixture(scope="module")
def bounded_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), cost_model=1))
    path = tmp_path_factory.mktemp("ckpt") / "bounded.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return path


def test_a_bounded_cost_model_picks_the_best_predicted_then_one_of_each_group(bounded_checkpoint):
    policy = Policy.load(bounded_checkpoint)
    picks = policy.top_k(P, H200, 8)
    scores = policy.scores(P, H200)
    assert picks[0].config == policy.model.space.points[scores.order[0].item()]
    assert len(picks) == 8 and len({p.config for p in picks}) == 8
    assert all(not violations(p.config, H200, P.dtype, P.k) for p in picks)
    groups = [diversity_group(p.config) for p in picks]
    assert len(set(groups)) == 8  # eight groups, each represented by its best predicted config
    for p in picks:
        same = [c for c in map(policy.model.space.points.__getitem__, scores.order.tolist())
                if diversity_group(c) == diversity_group(p.config)]
        assert same[0] == p.config
    assert policy.top_k(P, H200, 8) == picks  # from the cache: the same answer


def test_a_bounded_cost_models_distribution_is_a_softmax_over_the_valid_configs(bounded_checkpoint):
    policy = Policy.load(bounded_checkpoint)
    full = policy.model.space
    valid = [c for c in full if not violations(c, H200, P.dtype, P.k)]
    probs = dict(policy.rank(P, H200, valid))
    assert sum(probs.values()) == pytest.approx(1.0, rel=1e-4)
    best = max(probs, key=probs.get)
    worst = min(probs, key=probs.get)
    ratio = math.log(probs[best] / probs[worst]) * TEMPERATURE
    by_key = {x.config: x.predicted_tflops for x in policy.top_k(P, H200, 1)}
    assert best in by_key  # the most probable config is the first pick
    s = policy.scores(P, H200)
    assert ratio == pytest.approx((s.log_tflops[0] - s.by_flat[torch.isfinite(s.by_flat)].min()).item(), rel=1e-3)
    invalid = TileConfig(256, 256, 256, num_warps=2, num_stages=6)
    assert policy.rank(P, H200, [invalid]) == [(invalid, 0.0)]


# picks of meta-cost0.pt and plain-cost0.pt (shipped as meta.pt and plain.pt until 2026-12-05: the
# first checkpoints' model, cost_model 0) on main before the bounded cost model existed: (key, predicted TFLOP/s, probability) of the first three
OLD_PICKS = {
    ("meta", "1x16x4096x4096_bf16_rr_bgelu"): [("bm16_bn32_bk128_sk1_gm16_w4_s5_tma", 63.193, 0.00493),
                                                ("bm32_bn32_bk256_sk1_gm1_w4_s6_tma", 42.611, 0.02119),
                                                ("bm16_bn64_bk128_sk1_gm16_w4_s6_tma", 56.533, 0.01245)],
    ("meta", "1x1000x1000x1000_bf16_rc"): [("bm128_bn64_bk32_sk1_gm8_w8_s5_tma", 228.183, 0.00893),
                                           ("bm128_bn32_bk32_sk2_gm16_w4_s2_ptr", 100.125, 0.07153),
                                           ("bm128_bn64_bk64_sk1_gm8_w8_s3_tma", 185.177, 0.07144)],
    ("plain", "1x16x4096x4096_bf16_rr_bgelu"): [("bm16_bn64_bk128_sk1_gm16_w4_s6_tma", 77.582, 0.01367),
                                                 ("bm64_bn32_bk128_sk1_gm16_w4_s4_tma", 47.757, 0.02761),
                                                 ("bm32_bn32_bk256_sk1_gm1_w4_s6_tma", 58.946, 0.02564)],
    ("plain", "1x1000x1000x1000_bf16_rc"): [("bm128_bn256_bk64_sk1_gm8_w8_s4_tma", 1180.857, 0.02567),
                                            ("bm128_bn256_bk64_sk1_gm8_w8_s4_ptr", 466.064, 0.23416),
                                            ("bm128_bn256_bk64_sk1_gm16_w8_s4_ptr", 481.807, 0.16783)],
}


@pytest.mark.parametrize("name", ["meta", "plain"])
def test_the_shipped_first_checkpoints_pick_exactly_as_before(name):
    policy = Policy.load(DEFAULT_CHECKPOINT.parent / f"{name}-cost0.pt")
    assert policy.model.cfg.cost_model == 0 and policy.model.cfg.geometry
    for (ckpt, key), expected in OLD_PICKS.items():
        if ckpt == name:
            picks = policy.top_k(GemmProblem.from_key(key), H200, 3)
            got = [(x.config.key, x.predicted_tflops, x.probability) for x in picks]
            assert [g[0] for g in got] == [e[0] for e in expected]
            assert [g[1:] for g in got] == [pytest.approx(e[1:], abs=2e-3) for e in expected]


def test_a_bounded_policy_loaded_under_inference_mode_scores_and_caches(bounded_checkpoint):
    with torch.inference_mode():  # as gnn_policy.matmul loads it inside a user's inference_mode
        policy = Policy.load(bounded_checkpoint)
        picks = policy.top_k(P, H200, 4)
        assert policy.top_k(P, H200, 4) == picks and len(policy._scores) == 1
    assert policy.top_k(P, H200, 4) == picks


@pytest.mark.parametrize("path", sorted(DEFAULT_CHECKPOINT.parent.glob("*.pt")), ids=lambda p: p.name)
def test_every_shipped_checkpoint_loads_and_picks_within_its_space(path):
    """A change to a config space (a variant added to `hopper`, say) must not break a shipped checkpoint."""
    policy = Policy.load(path)
    picks = policy.top_k(P, H200, 4)
    assert len(picks) == 4 and all(p.config in policy.model.space for p in picks)
    assert all(not violations(p.config, H200, P.dtype, P.k) for p in picks)


def _with_winner(tmp_path, checkpoint, measured) -> Policy:
    from gnn_policy.policy import save_checkpoint

    path = tmp_path / "tuned.pt"
    save_checkpoint(Policy.load(checkpoint).model, path, measured=measured)
    return Policy.load(path)


def test_a_fine_tunes_measured_winner_is_picked_first_on_its_gpu_and_problem_alone(tmp_path, checkpoint):
    from gnn_policy.tune import TuneArgs, run, table

    plain = Policy.load(checkpoint).top_k(P, H200, 4)
    winner = plain[3].config  # a config the model ranks fourth, measured best on this GPU
    policy = _with_winner(tmp_path, checkpoint, {H200.name: {P.key: (winner.key, 123.4)}})
    picks = policy.top_k(P, H200, 4)
    assert (picks[0].config, picks[0].predicted_tflops, picks[0].measured) == (winner, 123.4, True)
    assert picks[0].probability == pytest.approx(plain[3].probability, rel=1e-5)  # the model's, unchanged
    assert [p.config for p in picks[1:]] == [p.config for p in plain[:3]] and len(picks) == 4
    assert policy.top_k(GemmProblem(32, 4096, 4096), H200, 4)[0].measured is False  # another problem
    assert policy.top_k(P, hardware_specs.load("h100"), 1)[0].measured is False  # another GPU
    out = run(TuneArgs(m=P.m, n=P.n, k=P.k, bias=True, activation="gelu", gpu="h200", checkpoint=str(tmp_path / "tuned.pt")))
    assert out["picks"][0]["predicted_tflops"] == 123.4 and out["picks"][0]["finetune_measured"]
    assert f"{winner.key}*" in table(out) and "measured on this GPU by the fine-tune" in table(out)


def test_a_measured_winner_the_rules_now_refuse_is_not_picked(tmp_path, checkpoint):
    invalid = TileConfig(256, 256, 128, num_stages=8)  # far more shared memory than the H200 has
    assert violations(invalid, H200, P.dtype, P.k)
    policy = _with_winner(tmp_path, checkpoint, {H200.name: {P.key: (invalid.key, 500.0)}})
    assert [p.config for p in policy.top_k(P, H200, 3)] == [p.config for p in Policy.load(checkpoint).top_k(P, H200, 3)]


@pytest.mark.parametrize("measured, needle", [({"H200": {"p": ["c", -1.0]}}, "measured winners are not"),
                                              ({"H200": ["c"]}, "measured winners are not"),
                                              ({"H200": {"p": ["bm7", 1.0]}}, "measured winner for p is not a config")])
def test_a_checkpoint_with_malformed_measured_winners_is_refused_by_name(tmp_path, checkpoint, measured, needle):
    from gnn_policy.checkpoint import CheckpointError

    state = torch.load(checkpoint, weights_only=True)
    torch.save({**state, "measured": measured}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=needle):
        Policy.load(tmp_path / "bad.pt")
