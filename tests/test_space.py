"""gnn_policy.space: the spaces and named lists, and the validity rules (TileConfig: test_tile_config)."""
import importlib

import pytest

import hardware_specs
from gnn_policy.space import TileConfig, named_list, space, violations

H200 = hardware_specs.load("h200")
A100 = hardware_specs.load("a100")
B200 = hardware_specs.load("b200")  # where the warpspec rules that Hopper's hang hides still apply


def _rules(config, gpu=H200, dtype="bf16", k=None):
    return {v.rule for v in violations(config, gpu, dtype, k)}


def test_sizes():
    assert len(space("full")) == 5 * 5 * 5 * 5 * 4 * 3 * 6 * 2
    assert len(space("seed")) == 96 == len(named_list("seed"))
    assert len(named_list("triton_tutorial")) == 16
    assert len(named_list("inductor_mm")) == 20
    assert all(c.group_m == 8 for c in named_list("inductor_mm"))
    assert set(space("seed")) <= set(space("full"))


def test_shared_memory_rule_counts_stages():
    # (128+256)*128*2 bytes per stage = 96 KiB: two stages fit the H200's 227 KiB, three do not.
    assert "smem" not in _rules(TileConfig(128, 256, 128, num_warps=8, num_stages=2))
    assert "smem" in _rules(TileConfig(128, 256, 128, num_warps=8, num_stages=3))
    assert "smem" in _rules(TileConfig(128, 128, 64, num_warps=4, num_stages=4), gpu=hardware_specs.load("rtx4090"))
    # fp32 operands take twice the bytes
    assert "smem" in _rules(TileConfig(128, 256, 64, num_warps=8, num_stages=3), dtype="fp32")


def test_register_rule_is_the_measured_spill_rule():
    assert "registers" in _rules(TileConfig(256, 256, 64, num_warps=2, num_stages=2))
    assert "registers" in _rules(TileConfig(128, 256, 32, num_warps=4))     # 256 per thread
    assert "registers" not in _rules(TileConfig(128, 256, 32, num_warps=8))  # 128 with 8 warps
    assert "registers" in _rules(TileConfig(64, 128, 32, num_warps=2))      # 128 with 2 warps
    assert "registers" not in _rules(TileConfig(64, 128, 32, num_warps=4))


def test_warps_rule():
    assert "warps" in _rules(TileConfig(16, 16, 32, num_warps=8))
    assert "warps" not in _rules(TileConfig(16, 16, 32, num_warps=4))


def test_split_k_rule_needs_a_tile_per_slice():
    c = TileConfig(64, 64, 64, split_k=4)
    assert "split_k" in _rules(c, k=192)      # 3 tiles of K for 4 slices
    assert "split_k" not in _rules(c, k=193)  # 4 tiles (the last one partial)
    assert "split_k" not in _rules(c)         # K unknown: not checked


def test_tma_needs_hopper_and_dtype_support():
    c = TileConfig(64, 64, 64, variant="tma")
    assert "tma" in _rules(c, gpu=A100) and not _rules(c)
    assert _rules(TileConfig(64, 64, 64), dtype="fp8") == {"dtype"}


def test_warpspec_is_refused_on_hopper_where_it_is_wrong_unless_a_trial_lifts_the_rule(monkeypatch):
    space_module = importlib.import_module("gnn_policy.space")  # the package's `space` is the function

    ok = TileConfig(128, 128, 64, num_warps=4, num_stages=3, variant="warpspec")
    for gpu in (H200, hardware_specs.load("h100")):
        found = violations(ok, gpu, "bf16")
        assert [v.rule for v in found] == ["warpspec-sm90"] and "wrong results" in found[0].message
    assert not [c for c in space("hopper").valid(H200, "bf16") if c.variant == "warpspec"]
    monkeypatch.setattr(space_module, "LIFTED_RULES", space_module.lifted_rules(" warpspec-sm90, "))
    assert not violations(ok, H200, "bf16")  # the trial's view: the variant's other rules still hold
    assert [v.rule for v in violations(TileConfig(128, 128, 64, num_warps=8, variant="warpspec"), H200, "bf16")] \
        == ["warpspec"]
    with pytest.raises(ValueError, match="smem cannot be lifted; only warpspec-sm90"):
        space_module.lifted_rules("warpspec-sm90,smem")


def test_warpspec_rules_from_compiling_for_sm90():
    ok = TileConfig(128, 128, 64, num_warps=4, num_stages=3, variant="warpspec")
    assert not _rules(ok, gpu=B200) and not _rules(ok, gpu=B200, dtype="fp16")
    assert _rules(ok, gpu=B200, dtype="fp32") == {"warpspec"}  # Triton 3.6 fails to compile most fp32 dots
    for bad in (TileConfig(128, 128, 64, num_warps=8, variant="warpspec"),
                TileConfig(32, 128, 64, num_warps=4, variant="warpspec"),
                TileConfig(64, 256, 64, num_warps=4, num_stages=2, variant="warpspec"),
                TileConfig(128, 128, 64, split_k=2, num_warps=4, variant="warpspec"),
                TileConfig(128, 128, 64, num_warps=4, num_stages=1, variant="warpspec")):
        assert "warpspec" in _rules(bad, gpu=B200), bad.key
    # the same tiles are fine for the unspecialised persistent loop
    assert not _rules(TileConfig(128, 64, 32, num_warps=4, num_stages=3, variant="persistent"), dtype="fp32")


def test_subtile_stages_half_the_output_tile():
    """Compiled for sm_90: a 128x256 bf16 tile's store stages 64 KB whole and 32 KB in halves, so
    four 48 KB pipeline stages fit the H200's 227 KB only when the tile is stored in halves."""
    deep = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4)
    assert "smem" in _rules(TileConfig(**deep, variant="persistent"))
    assert not _rules(TileConfig(**deep, variant="subtile"))
    assert not _rules(TileConfig(**dict(deep, num_stages=3), variant="persistent"))


def test_valid_counts_and_messages():
    assert 10_000 < len(space("full").valid(H200, "bf16")) < len(space("full"))
    message = str(violations(TileConfig(256, 256, 256, num_warps=8, num_stages=6), H200, "bf16")[0])
    assert message.startswith("[smem]") and "H200-SXM-141GB" in message


def test_unknown_names():
    with pytest.raises(KeyError, match="known"):
        space("huge")
    with pytest.raises(KeyError, match="triton_tutorial"):
        named_list("cutlass")


def test_mask_follows_the_knob_order_and_the_tma_layout_rule():
    import hardware_specs as hs
    from graphs import GemmProblem
    from gnn_policy.space import ConfigSpace, tma_fits

    gpu = hs.load("h200")
    odd = ConfigSpace("odd", (("split_k", (1, 2, 4)), ("block_m", (16, 64)), ("block_n", (64,)),
                              ("block_k", (16, 32, 64, 128, 256))))
    mask = odd.mask(gpu, "bf16", 64)
    for config in odd:
        assert bool(mask[odd.index(config)]) == (not violations(config, gpu, "bf16", 64)), config
    lm_head = GemmProblem(16, 50257, 768)  # 50257 x 2 bytes: B's rows are not 16-byte aligned
    assert not tma_fits(lm_head) and tma_fits(GemmProblem(16, 50256, 768))
    full = space("full")
    pm = full.problem_mask(gpu, lm_head)
    assert not any(pm[full.index(c)] for c in full if c.variant == "tma")
    assert pm.sum() > 0 and full.mask(gpu, "bf16").sum() > pm.sum()


def test_flat_index_is_a_points_position_and_a_masks_entry():
    s = space("hopper")
    for i in (0, 1, 777, len(s) - 1):
        assert s.flat_index(s.points[i]) == i
    with pytest.raises(ValueError, match="not in the"):
        space("seed").flat_index(s.points[-1])
