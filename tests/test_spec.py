"""hardware_specs: every shipped YAML loads, aliases resolve, bad files fail loudly."""
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import hardware_specs
from hardware_specs import spec as spec_mod

REQUIRED = ["A100-SXM4-80GB", "A100-PCIe-40GB", "H100-SXM5-80GB", "H100-PCIe-80GB", "H200-SXM-141GB",
            "H20", "B200", "L40S", "L4", "RTX-4090", "RTX-3090", "MI300X"]


def test_every_required_gpu_has_a_spec():
    assert set(REQUIRED) <= set(hardware_specs.available())


@pytest.mark.parametrize("name", REQUIRED)
def test_spec_values_are_sane(name):
    s = hardware_specs.load(name)
    assert s.sm_count >= 50 and s.l2_bytes >= 4 * 2**20
    assert s.smem_per_block_bytes <= s.smem_per_sm_bytes
    assert s.peak("bf16") >= s.peak("fp32") > 0
    assert all(s.sources[f] for f in ("sm_count", "l2_bytes", "peak_tflops"))
    # dense bf16 TFLOP/s per SM-GHz: ~0.5 (Ada/Ampere consumer), ~2 (A100), ~3.8 (Hopper);
    # a unit slip (MHz for GHz, TB/s for GB/s) moves it by 1000x
    assert 0.1 < s.peak("bf16") / (s.sm_count * s.sm_clock_mhz * 1e-3) < 10


@pytest.mark.parametrize("alias", ["h100", "H100-SXM", "NVIDIA H100 80GB HBM3", "nvidia_h100_80gb_hbm3", "H100_sxm"])
def test_aliases_are_case_and_punctuation_insensitive(alias):
    assert hardware_specs.load(alias).name == "H100-SXM5-80GB"


def test_h200_is_the_measured_part():
    s = hardware_specs.load("NVIDIA H200")
    assert (s.name, s.sm_count, s.l2_bytes) == ("H200-SXM-141GB", 132, 60 * 2**20)
    assert s.has("tma") and s.has("wgmma")


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(hardware_specs.SpecError) as err:
        hardware_specs.load("h300")
    assert "h300" in str(err.value) and "H200-SXM-141GB" in str(err.value) and "MI300X" in str(err.value)


def _broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / "broken.yaml"
    text = (spec_mod.SPEC_DIR / "h200_sxm_141gb.yaml").read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("old,new,field", [
    ("sm_count: 132\n", "", "sm_count"),
    ("sm_count: 132", "sm_count: many", "sm_count"),
    ("sm_count: 132", "sm_count: true", "sm_count"),
    ("bf16: 989.4,", "bf16: fast,", "peak_tflops.bf16"),
    ("tma: true", "tma: 1", "features.tma"),
    ("  l2_bytes: torch", "  l2_byte: torch", "sources.l2_bytes"),
    ("launch_floor_us: 2.5", "launch_floor_us: soon", "launch_floor_us"),
    ("launch_floor_us: 2.5", "launch_floor_us: -1.0", "launch_floor_us"),
    ("  launch_floor_us: \"python", "  launch_floor: \"python", "sources.launch_floor_us"),
])
def test_bad_yaml_names_file_and_field(tmp_path, old, new, field):
    with pytest.raises(hardware_specs.SpecError) as err:
        spec_mod.parse(_broken_copy(tmp_path, old, new))
    assert "broken.yaml" in str(err.value) and f"'{field}'" in str(err.value)


def test_the_launch_floor_is_measured_on_the_h200_and_h100_and_a_default_elsewhere(tmp_path):
    h200 = hardware_specs.load("h200")
    assert h200.launch_floor_us == 2.5 and "2.54 us" in h200.sources["launch_floor_us"]
    # the default is the H200's measured floor, and says it was not measured on the GPU
    assert spec_mod.DEFAULT_LAUNCH_FLOOR_US == h200.launch_floor_us
    h100 = hardware_specs.load("h100")
    assert h100.launch_floor_us == 1.6 and "1.622 us" in h100.sources["launch_floor_us"]
    a100 = hardware_specs.load("a100")
    assert a100.launch_floor_us == spec_mod.DEFAULT_LAUNCH_FLOOR_US
    assert a100.sources["launch_floor_us"] == spec_mod.DEFAULT_LAUNCH_FLOOR_SOURCE
    assert hardware_specs.load("h200-sm64").launch_floor_us == h200.launch_floor_us  # a slice keeps its GPU's
    without = spec_mod.parse(_broken_copy(tmp_path, "launch_floor_us: 2.5\n", ""))
    assert without.launch_floor_us == spec_mod.DEFAULT_LAUNCH_FLOOR_US
    assert without.sources["launch_floor_us"] == spec_mod.DEFAULT_LAUNCH_FLOOR_SOURCE
    assert spec_mod.parse(_broken_copy(tmp_path, "launch_floor_us: 2.5", "launch_floor_us: 4")).launch_floor_us == 4.0


def test_not_yaml_is_an_error(tmp_path):
    path = tmp_path / "junk.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(hardware_specs.SpecError, match="junk.yaml"):
        spec_mod.parse(path)


def test_as_dict_uses_the_yaml_field_names():
    d = hardware_specs.load("h200").as_dict()
    for key in ("name", "sm_count", "l2_bytes", "smem_per_block_bytes", "peak_tflops", "features", "sources"):
        assert key in d


def test_detect_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(hardware_specs.SpecError, match="no CUDA device"):
        hardware_specs.detect()


def test_detect_cross_checks_and_warns(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=50 * 2**20)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    with pytest.warns(UserWarning, match="l2_bytes"):
        assert hardware_specs.detect().name == "H200-SXM-141GB"
    props.L2_cache_size = 60 * 2**20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hardware_specs.detect()


def test_sm_slices_scale_the_sm_count_and_peaks():
    s = hardware_specs.load("h200-sm64")
    full = hardware_specs.load("h200")
    assert (s.name, s.sm_count, s.slice_of) == ("H200-SXM-141GB-sm64", 64, "H200-SXM-141GB")
    assert s.peak("bf16") == round(full.peak("bf16") * 64 / 132, 1) and s.l2_bytes == full.l2_bytes
    assert hardware_specs.load("H200-SXM-141GB-sm64") == s  # its own name loads it back
    assert hardware_specs.load("h200_sm132") == full
    with pytest.raises(hardware_specs.SpecError, match="132 SMs"):
        hardware_specs.load("h200-sm200")


def test_a_slice_the_driver_would_round_is_refused():
    # on the H200 a green context of 66 SMs ran on 72: a spec saying 66 would be wrong
    with pytest.raises(hardware_specs.SpecError, match="multiples of 8 SMs.*would run on 72"):
        hardware_specs.load("h200-sm66")
    with pytest.raises(hardware_specs.SpecError, match="at least 8"):
        hardware_specs.load("h200-sm4")
    assert hardware_specs.load("a100-sm6").sm_count == 6  # Ampere: multiples of 2, at least 4
