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
from gnn_policy.policy import COST_WEIGHT, RERANK, Policy, autotune_pruner
from gnn_policy.space import NAMED_LISTS, violations

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
