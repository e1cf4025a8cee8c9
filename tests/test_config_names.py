"""Meta-parameter spellings, and the autotune pruner on kernels that name them their own way."""
import dataclasses

import pytest
import torch
import triton

import hardware_specs
from graphs import GemmProblem
from gnn_policy import config_names as cn
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import Policy, autotune_pruner
from gnn_policy.space import NAMED_LISTS, TileConfig

H200 = hardware_specs.load("h200")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,)))
    path = tmp_path_factory.mktemp("ckpt") / "p.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return Policy.load(path)


def test_every_common_spelling_reads():
    tutorial = triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8},
                             num_stages=3, num_warps=8)
    assert cn.read(tutorial) == TileConfig(128, 256, 64, 1, 8, 8, 3, "ptr")
    short = triton.Config({"BM": 64, "BN": 32, "BK": 32}, num_stages=4, num_warps=4)
    assert cn.read(short) == TileConfig(64, 32, 32, 1, 1, 4, 4, "ptr")  # no group knob: no swizzle
    tma = TileConfig(64, 128, 64, 2, 4, 4, 3, "tma")
    assert cn.read(tma.to_triton()) == tma
    custom = triton.Config({"TILE_M": 32, "TILE_N": 64, "TILE_K": 16, "SWIZZLE": 4}, num_stages=2, num_warps=2)
    assert cn.read(custom) is None
    names = cn.check_names({"block_m": "TILE_M", "block_n": "TILE_N", "block_k": "TILE_K", "group_m": "SWIZZLE"})
    assert cn.read(custom, names) == TileConfig(32, 64, 16, 1, 4, 2, 2, "ptr")
    assert cn.read(triton.Config({"BM": 48, "BN": 32, "BK": 32})) is None  # not a power of two
    with pytest.raises(ValueError, match="unknown knobs \\['tile_m'\\]"):
        cn.check_names({"tile_m": "TM"})


def test_writing_each_spelling():
    tile = TileConfig(64, 128, 32, 1, 8, 4, 3, "ptr")
    assert cn.kwargs(tile, "tutorial") == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
    assert cn.source(tile, "short") == "triton.Config({'BM': 64, 'BN': 128, 'BK': 32, 'GM': 8}, num_warps=4, num_stages=3)"
    split = dataclasses.replace(tile, split_k=4)
    assert cn.expressible(split, "project") and not cn.expressible(split, "tutorial")
    with pytest.raises(ValueError, match="lack"):
        cn.kwargs(split, "tutorial")
    assert cn.kwargs(split, "project") == dict(split.to_triton().kwargs)


def test_the_pruner_ranks_tutorial_named_configs(policy):
    problem = GemmProblem(512, 512, 512, dtype="fp16")
    configs = [triton.Config(cn.kwargs(t, "tutorial"), num_warps=t.num_warps, num_stages=t.num_stages)
               for t in NAMED_LISTS["triton_tutorial"][:8]]
    prune = autotune_pruner(policy, 2, H200, lambda a: problem)["early_config_prune"]
    picked = prune(configs, {})
    best = [c for c, p in policy.rank(problem, H200, [cn.read(c) for c in configs]) if p > 0][:2]
    assert [cn.read(c) for c in picked] == best


def test_unreadable_configs_warn_once_naming_keys_and_are_all_tuned(policy):
    configs = [triton.Config({"TILE_M": m, "TILE_N": 64, "TILE_K": 32}, num_warps=4, num_stages=3) for m in (32, 64, 128)]
    prune = autotune_pruner(policy, 1, H200, lambda a: GemmProblem(256, 256, 256))["early_config_prune"]
    with pytest.warns(UserWarning, match="cannot read 3 of 3 configs \\(keys seen: TILE_K, TILE_M, TILE_N\\)") as rec:
        assert prune(configs, {}) == configs  # a full autotune, not the list's first entry
        prune(configs, {})
    assert len(rec) == 1
    mapped = autotune_pruner(policy, 1, H200, lambda a: GemmProblem(256, 256, 256),
                             names={"block_m": "TILE_M", "block_n": "TILE_N", "block_k": "TILE_K"})
    assert len(mapped["early_config_prune"](configs, {})) == 1
