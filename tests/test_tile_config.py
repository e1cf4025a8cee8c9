"""gnn_policy.tile_config: TileConfig's keys and conversions round-trip, bad values are refused."""
import random

import pytest

from gnn_policy.space import NAMED_LISTS, space
from gnn_policy.tile_config import TileConfig


def test_keys_round_trip_and_are_unique():
    configs = random.Random(0).sample(list(space("full")), 2000) + [c for cs in NAMED_LISTS.values() for c in cs]
    for c in configs:
        assert TileConfig.from_key(c.key) == c
    sample = random.Random(1).sample(list(space("full")), 20000)
    assert len({c.key for c in sample}) == len(sample)


def test_stable_key_text():
    assert TileConfig(128, 64, 32, 2, 8, 4, 3, "tma").key == "bm128_bn64_bk32_sk2_gm8_w4_s3_tma"


def test_hashable_and_frozen():
    c = TileConfig(64, 64, 32)
    assert {c: 1}[TileConfig(64, 64, 32)] == 1
    with pytest.raises(Exception):
        c.block_m = 32


@pytest.mark.parametrize("bad", [dict(block_m=48), dict(block_n=0), dict(num_warps=3), dict(variant="wgmma"),
                                 dict(split_k=True)])
def test_constructor_rejects_bad_values(bad):
    kw = dict(block_m=64, block_n=64, block_k=32) | bad
    with pytest.raises(ValueError):
        TileConfig(**kw)


def test_bad_key_is_an_error():
    with pytest.raises(ValueError, match="not a TileConfig key"):
        TileConfig.from_key("bm64_bn64")
    with pytest.raises(ValueError, match="canonical"):
        TileConfig.from_key("bm064_bn64_bk32_sk1_gm8_w4_s3_ptr")


def test_triton_round_trip():
    for c in [TileConfig(128, 256, 64, 1, 8, 8, 3), TileConfig(16, 32, 256, 4, 1, 2, 5, "tma")]:
        tc = c.to_triton()
        assert tc.kwargs["BLOCK_M"] == c.block_m and tc.num_warps == c.num_warps
        assert TileConfig.from_triton(tc) == c


def test_vllm_keys_round_trip():
    c = TileConfig(64, 128, 128, 1, 16, 4, 3)
    d = c.to_vllm()
    assert d == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
                 "num_warps": 4, "num_stages": 3}
    assert TileConfig.from_vllm(d) == c
    assert TileConfig.from_vllm(TileConfig(16, 64, 64, 4).to_vllm()).split_k == 4
    tma = TileConfig(64, 64, 64, variant="tma")
    assert TileConfig.from_vllm(tma.to_vllm()) == tma
    with pytest.raises(ValueError, match="num_stages"):
        TileConfig.from_vllm({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "num_warps": 4})
