"""The GPU benchmark scripts' CPU-runnable parts: flags, tables from given rows, the CPU refusal,
the tutorial-style kernel (interpreter) and the blocks' layer names."""
import dataclasses
import warnings

import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from graphs.capture import capture
from graphs.model_config import load_config, model_gemms
from gnn_policy.benchmarks import adapter_bench, model_e2e
from gnn_policy.benchmarks.blocks import gpt2_block, llama_block
from gnn_policy.benchmarks.tutorial_kernel import autotuned, matmul, tutorial_configs
from gnn_policy.kernels.reference import reference, relative_error
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import Policy, autotune_pruner

H200 = hardware_specs.load("h200")
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def test_model_e2e_flags_and_table():
    ns = model_e2e.parse(["--out", "x", "--modes", "patch,compile", "--tokens", "1,16"])
    assert ns.modes == ["eager", "patch", "compile"] and ns.tokens == [1, 16] and ns.blocks == ["llama-3-8b", "gpt2"]
    with pytest.raises(SystemExit):
        model_e2e.parse(["--out", "x", "--modes", "fast"])
    rows = [dict(block="gpt2", tokens=16, mode=m, copies=9, setup_s=s, graph_ms=ms, spread=0.01, call_ms=2 * ms,
                 rel_err=e) for m, s, ms, e in [("eager", 0.1, 0.04, 0.0), ("max-autotune", 60.0, 0.03, 3e-3),
                                                ("patch", 5.0, 0.02, 4e-3)]]
    text = model_e2e.table(rows)
    line = text.splitlines()[2]
    assert line.startswith("| gpt2 | 16 | 0.0400 | - | 0.0300 (1.33x), 60.0 s | 0.0200 (2.00x), 5.0 s | 1.50x |")
    assert "4.0e-03 (ok)" in line and "0.0800 / 0.0400" in line


def test_adapter_bench_flags_and_table():
    ns = adapter_bench.parse(["--out", "x", "--shapes", "16x64x64,32x32x32", "--methods", "full,policy-2"])
    assert ns.shapes == [(16, 64, 64), (32, 32, 32)] and ns.methods == ["full", "policy-2"]
    with pytest.raises(SystemExit):
        adapter_bench.parse(["--out", "x", "--methods", "policy"])
    rows = [{"method": m, "shape": [16, 64, 64], "tuning_s": t, "policy_load_s": load, "kernel_ms": ms, "warnings": []}
            for m, t, load, ms in [("full", 10.0, 0.0, 0.010), ("policy-2", 0.5, 2.0, 0.0125)]]
    text = adapter_bench.table(rows)
    assert "| 16 | 64 | 64 | 10.00 | 0.0100 | 0.50 | 0.0125 | 0.800 |" in text
    assert "- policy-2: tuning 0.5 s over 1 shapes, geomean quality 0.800, policy load 2.0 s" in text


@CPU_ONLY
def test_the_scripts_refuse_a_machine_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match="model_e2e needs a CUDA GPU"):
        model_e2e.main(["--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="adapter_bench needs a CUDA GPU"):
        adapter_bench.main(["--out", str(tmp_path)])


def test_tutorial_kernel_is_right_and_the_pruner_reads_its_names(tmp_path):
    a, b = torch.randn(20, 48, dtype=torch.float16), torch.randn(48, 24, dtype=torch.float16)
    one = tutorial_configs()[7]  # 32x64x32: small, so the interpreter is quick
    assert relative_error(matmul(autotuned([one]), a, b), reference(a, b)) < 1e-2
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,)))
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, tmp_path / "p.pt")
    prune = autotune_pruner(Policy.load(tmp_path / "p.pt"), 4, H200,
                            lambda a: GemmProblem(a["M"], a["N"], a["K"], dtype="fp16"))["early_config_prune"]
    configs = tutorial_configs()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="autotune_pruner")  # every tutorial config is read
        picked = prune(configs, {"M": 512, "N": 4096, "K": 4096})
    assert len(picked) == 4 and all(c in configs for c in picked)


@pytest.mark.parametrize("make, config", [(llama_block, "llama-3-8b"), (gpt2_block, "gpt2")])
def test_blocks_name_their_layers_as_the_configs_do(make, config):
    traced = {g.problem.layer: g.problem for g in capture(*make(16)) if g.problem.batch == 1}
    rows = {g.layer: g.problem for g in model_gemms(load_config(config), 16) if g.layer != "lm_head"}
    assert set(traced) == set(rows)
    assert all((traced[k].m, traced[k].n, traced[k].k, traced[k].b_layout) == (p.m, p.n, p.k, p.b_layout)
               for k, p in rows.items())
