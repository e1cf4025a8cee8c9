"""`tune --model`: a config or a traced module, one row per distinct GEMM and token count."""
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import hardware_specs
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.model_tune import ModelSpecError, distinct_rows, model_gemm_list, model_rows, parse_tokens, run, table
from gnn_policy.tune import TuneArgs, TuneError, run as run_tune

H200 = hardware_specs.load("h200")
MODULE = '''
import torch, torch.nn as nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.conv = nn.Linear(32, 64), nn.Linear(64, 32), nn.Conv1d(2, 2, 1)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x))), self.conv(x[:, :2].t())

def tiny(tokens):
    return Tiny(), (torch.randn(tokens, 32),)

def fixed():
    return Tiny(), torch.randn(3, 32)
'''


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,)))
    path = tmp_path_factory.mktemp("ckpt") / "p.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return path


@pytest.fixture
def module_file(tmp_path):
    path = tmp_path / "user_model.py"
    path.write_text(MODULE)
    return path


def test_config_rows_group_layers_and_count_calls(checkpoint):
    out = run(TuneArgs(model="llama-3-8b", tokens="1,16", gpu="h200", checkpoint=str(checkpoint)))
    rows = {(r["tokens"], r["shape"], r["epilogue"]): r for r in out["rows"]}
    assert len(out["rows"]) == 14  # q, k/v, o, gate, up, down, lm_head at two token counts
    kv = rows[(16, "16x1024x4096", "-")]
    assert kv["layers"] == ["self_attn.k_proj", "self_attn.v_proj"] and kv["calls"] == 64
    assert rows[(1, "1x4096x4096", "residual")]["layers"] == ["self_attn.o_proj"]
    assert all(r["layouts"] == "row/col" and r["predicted_tflops"] > 0 for r in out["rows"])
    assert not out["calibrated"]  # no calibration beside this checkpoint: capped at the roofline
    assert out["skipped"][0]["what"].startswith("attention scores")
    text = table(out)
    assert "self_attn.k_proj, self_attn.v_proj" in text and "capped at the roofline" in text


def test_a_traced_module_per_token_count_and_what_it_skips(checkpoint, module_file):
    name, calls, skipped = model_gemm_list(f"{module_file}:tiny", [4, 8], "bf16")
    rows = distinct_rows(calls)
    assert [(r["tokens"], r["layers"]) for r in rows] == [(4, ["up"]), (4, ["down"]), (8, ["up"]), (8, ["down"])]
    assert skipped == [("conv", "Conv1d: its GEMMs run inside the module")]
    out = run(TuneArgs(model=f"{module_file}:tiny", tokens="4", gpu="h200", checkpoint=str(checkpoint)))
    assert [r["epilogue"] for r in out["rows"]] == ["bias+relu", "bias+residual"]
    assert [r["shape"] for r in out["rows"]] == ["4x64x32", "4x32x64"]
    assert out["rows"][0]["problem"].endswith("_fp32_rc_brelu")


def test_module_spec_errors(module_file):
    with pytest.raises(ModelSpecError, match="takes no `tokens` argument"):
        model_gemm_list(f"{module_file}:fixed", [4], "bf16")
    assert model_gemm_list(f"{module_file}:fixed", None, "bf16")[1][0][0] is None  # the inputs set the shapes
    with pytest.raises(ModelSpecError, match="has no function 'nope'"):
        model_gemm_list(f"{module_file}:nope", None, "bf16")
    with pytest.raises(ModelSpecError, match="neither a config.json"):
        model_gemm_list("no_such_thing", None, "bf16")
    with pytest.raises(ModelSpecError, match="positive integers"):
        parse_tokens("1,x")


def test_cli_names_the_bad_field_and_refuses_measure_without_cuda(tmp_path, checkpoint):
    cfg = json.loads(open("graphs/data/models/gpt2.json").read())
    cfg["n_head"] = "12"
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    cli = [sys.executable, "-m", "gnn_policy.cli", "tune", "--checkpoint", str(checkpoint)]
    res = subprocess.run(cli + ["--model", str(tmp_path / "c.json")], capture_output=True, text=True)
    assert res.returncode == 2 and "field 'n_head' must be a positive integer, got '12' (str)" in res.stderr
    with pytest.raises(TuneError, match="give --m, --n and --k"):
        run_tune(TuneArgs(m=16))
    with pytest.raises(TuneError, match="leave --m, --n and --k out"):
        run_tune(TuneArgs(model="gpt2", m=16))
    with pytest.raises(TuneError, match="from the model: leave --batch, --bias, --activation, --b-layout out"):
        run_tune(TuneArgs(model="gpt2", batch=4, bias=True, activation="relu", b_layout="col"))
    with pytest.raises(TuneError, match="--tp splits the GEMMs of a --model config"):
        run_tune(TuneArgs(m=16, n=16, k=16, tp=2))
    with pytest.raises(ModelSpecError, match="leave --tp out"):
        model_rows("gnn_policy.benchmarks.blocks:gpt2_block", "16", "bf16", tp=2)
    if not torch.cuda.is_available():
        res = subprocess.run(cli + ["--model", "gpt2", "--tokens", "1", "--measure"], capture_output=True, text=True)
        assert res.returncode == 2 and "--measure needs a CUDA GPU" in res.stderr
