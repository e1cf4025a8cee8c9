"""The warp-specialisation probe's kernel computes A @ B in both forms and both B layouts
(interpreter: the warp specialisation itself is a GPU matter), and its driver turns a hung or
crashed child into a row without losing the rows before it."""
import json
import subprocess

import pytest
import torch

from gnn_policy.benchmarks import warpspec_probe as probe


@pytest.mark.parametrize("form", ["inner", "persistent"])
@pytest.mark.parametrize("layout", ["row", "col"])
def test_probe_kernel_matches_torch_on_odd_sizes(form, layout):
    torch.manual_seed(0)
    m, n, k = 70, 40, 72  # M odd-tiled; N and K multiples of 8, as 16-byte tensor-map strides need
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(n, k, dtype=torch.float16).T if layout == "col" else torch.randn(k, n, dtype=torch.float16)
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    config = probe.ProbeConfig(form, 32, 32, 32, 2, group_m=2)
    probe.launch(config, a, b, c, programs=3)  # 3 programs loop over 6 tiles in the persistent form
    ref = a.float() @ b.float()
    assert torch.allclose(c.float(), ref, rtol=1e-2, atol=1e-2)


def test_probe_configs_have_unique_keys_and_pair_each_ws_kernel_with_its_plain_twin():
    keys = [c.key for c in probe.CONFIGS]
    assert len(keys) == len(set(keys))
    for c in probe.CONFIGS:
        if c.warp_specialize:
            assert c.key.replace("_ws_", "_plain_") in keys


def test_a_hung_child_becomes_a_row_and_the_rows_before_it_stay(monkeypatch):
    shapes = [[64, 64, 64, "row", "x"], [128, 128, 128, "col", "x"], [256, 256, 256, "row", "x"]]
    first = json.dumps({"impl": "p", "shape": "64x64x64_row", "status": "ok", "tflops": 1.0})

    def hangs(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"], output=first + "\n")

    monkeypatch.setattr(probe.subprocess, "run", hangs)
    rows = probe._run_child("p", shapes, timeout_s=5)
    assert [(r["shape"], r["status"]) for r in rows] == [("64x64x64_row", "ok"), ("128x128x128_col", "hung")]
    assert "killed after 5 s" in rows[1]["error"]

    def crashes(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, -11, stdout=first + "\n", stderr="Segmentation fault")

    monkeypatch.setattr(probe.subprocess, "run", crashes)
    rows = probe._run_child("p", shapes, timeout_s=5)
    assert rows[1]["status"] == "crashed" and "Segmentation" in rows[1]["error"]


def test_report_ranks_each_shape_against_cublas_and_the_template():
    rows = [{"impl": "cublas", "shape": "s", "status": "ok", "tflops": 200.0},
            {"impl": "bm128_bn128_bk64_sk1_gm8_w4_s4_tma", "shape": "s", "status": "ok", "tflops": 100.0},
            {"impl": "inner_ws_x", "shape": "s", "status": "ok", "tflops": 150.0, "warp_specialized": True},
            {"impl": "inner_plain_x", "shape": "s", "status": "hung"}]
    table = probe.report(rows)
    lines = table.splitlines()[2:]
    assert lines[0].startswith("| s | cublas |") and "| 1.000 | 2.000 |" in lines[0]
    assert "| s | inner_ws_x | ok | yes | - | 150.0 | 0.750 | 1.500 |" in lines
    assert "| s | inner_plain_x | hung | - | - | - | - | - |" in lines
