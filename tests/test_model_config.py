"""graphs.model_config: config.json -> named GEMMs per token count, and errors that name the field."""
import dataclasses
import json

import pytest

from graphs.model_config import ConfigError, examples, load_config, model_gemms, parse_config, skipped


def _by_layer(spec, tokens):
    return {g.layer: g for g in model_gemms(spec, tokens)}


def test_llama_gemms_respect_gqa_and_epilogues():
    spec = load_config("llama-3-8b")  # a shipped example by name
    g = _by_layer(spec, 16)
    shapes = {k: (v.problem.m, v.problem.n, v.problem.k) for k, v in g.items()}
    assert shapes["self_attn.q_proj"] == (16, 4096, 4096)
    assert shapes["self_attn.k_proj"] == shapes["self_attn.v_proj"] == (16, 1024, 4096)  # 8 KV heads of 128
    assert shapes["mlp.down_proj"] == (16, 4096, 14336) and shapes["lm_head"] == (16, 128256, 4096)
    assert g["self_attn.o_proj"].problem.residual and g["mlp.down_proj"].problem.residual
    assert g["mlp.gate_proj"].problem.activation == "silu" and g["mlp.up_proj"].problem.activation is None
    assert all(v.problem.b_layout == "col" and v.problem.a_layout == "row" for v in g.values())
    assert g["self_attn.q_proj"].count == 32 and g["lm_head"].count == 1
    assert not any(v.problem.bias for v in g.values())


def test_gpt2_schema_biases_and_unfused_tanh_gelu():
    spec = load_config(examples()["gpt2"])
    g = _by_layer(spec, 128)
    assert (g["attn.c_attn"].problem.n, g["attn.c_attn"].problem.k, g["attn.c_attn"].problem.bias) == (2304, 768, True)
    assert g["mlp.c_fc"].problem.n == 3072 and g["mlp.c_fc"].problem.activation is None  # gelu_new is not exact GELU
    assert not g["lm_head"].problem.bias and g["lm_head"].problem.n == 50257
    assert any("gelu_new" in what for what, _ in skipped(spec))


def test_mixtral_experts_are_batched_like_the_fused_kernel():
    spec = load_config("mixtral-8x7b")
    one, many = _by_layer(spec, 1), _by_layer(spec, 128)
    up = one["mlp.experts.gate_up_proj"].problem
    assert (up.batch, up.m, up.n, up.k) == (2, 1, 28672, 4096)  # 1 token to 2 experts
    down = many["mlp.experts.down_proj"].problem
    assert (down.batch, down.m, down.n, down.k) == (8, 32, 4096, 14336)  # 256 rows over 8 experts
    assert many["mlp.gate (router)"].problem.n == 8 and "mlp.gate_proj" not in many


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": None}, "field 'hidden_size' must be a positive integer, got None"),
    ({"hidden_size": "4096"}, r"field 'hidden_size' must be a positive integer, got '4096' \(str\)"),
    ({"num_attention_heads": True}, "field 'num_attention_heads' must be a positive integer"),
    ({"num_key_value_heads": 5}, "field 'num_key_value_heads' \\(5\\) must divide"),
    ({"num_experts_per_tok": 9}, "field 'num_experts_per_tok' \\(9\\) exceeds the 8 experts"),
    ({"hidden_act": 3}, "field 'hidden_act' must be a str"),
])
def test_ill_typed_fields_are_named(change, message):
    cfg = json.loads(examples()["mixtral-8x7b"].read_text())
    cfg.update(change)
    with pytest.raises(ConfigError, match=message):
        parse_config(cfg, where="x.json")


def test_missing_fields_and_files_are_named(tmp_path):
    cfg = json.loads(examples()["llama-3-8b"].read_text())
    del cfg["intermediate_size"]
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"c.json: field 'intermediate_size' is missing"):
        load_config(tmp_path / "c.json")
    with pytest.raises(ConfigError, match="shipped examples: gpt2, llama-3-8b, mixtral-8x7b"):
        load_config(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a JSON object"):
        load_config(tmp_path / "bad.json")


def test_examples_ship_as_package_data():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert "data/models/*.json" in data["tool"]["setuptools"]["package-data"]["graphs"]
    assert set(examples()) == {"gpt2", "llama-3-8b", "mixtral-8x7b"}


def test_a_model_type_of_another_schema_is_refused_and_qwen2_biases_q_k_v_alone():
    cfg = json.loads(examples()["llama-3-8b"].read_text())
    with pytest.raises(ConfigError, match="x.json: model_type 'bert' is not one whose GEMMs this reads"):
        parse_config({**cfg, "model_type": "bert"}, where="x.json")
    biased = {g.layer: g.problem.bias for g in model_gemms(parse_config({**cfg, "model_type": "qwen2"}), 16)}
    assert biased["self_attn.q_proj"] and biased["self_attn.k_proj"] and biased["self_attn.v_proj"]
    assert not biased["self_attn.o_proj"] and not biased["mlp.down_proj"]
    unset = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}  # neither: Llama's schema
    assert model_gemms(parse_config(unset), 16) == model_gemms(parse_config(cfg), 16)
    llama = {g.layer: g.problem.bias for g in model_gemms(parse_config({**cfg, "attention_bias": True}), 16)}
    assert llama["self_attn.o_proj"] and llama["self_attn.q_proj"]
    # without model_type, the class names decide: a BERT is refused, a Qwen2 gets its q, k, v biases
    assert model_gemms(parse_config({**unset, "architectures": None}), 16) == model_gemms(parse_config(cfg), 16)
    with pytest.raises(ConfigError, match="Llama4ForConditionalGeneration"):
        parse_config({**unset, "architectures": ["Llama4ForConditionalGeneration"]})
    with pytest.raises(ConfigError, match=r"x.json: architectures \['BertModel'\] are not ones whose GEMMs"):
        parse_config({**unset, "architectures": ["BertModel"]}, where="x.json")
    qwen = {g.layer: g.problem.bias for g in model_gemms(parse_config({**unset, "architectures": ["Qwen2ForCausalLM"]}), 16)}
    assert qwen["self_attn.q_proj"] and not qwen["self_attn.o_proj"]
    with pytest.raises(ConfigError, match="field 'architectures' must be a list of class names"):
        parse_config({**unset, "architectures": "LlamaForCausalLM"})


def test_tensor_parallel_shares_split_n_or_k_as_vllm_does():
    from graphs.model_config import sharded

    llama = load_config("llama-3-8b")
    half = {g.layer: g.problem for g in model_gemms(sharded(llama, 2), 16)}
    assert (half["self_attn.q_proj"].n, half["self_attn.k_proj"].n, half["mlp.gate_proj"].n) == (2048, 512, 7168)
    assert half["mlp.gate_proj"].activation == "silu"  # column-parallel: the epilogue stays
    down = half["mlp.down_proj"]
    assert (down.n, down.k, down.residual, down.bias) == (4096, 7168, False, False)  # row-parallel: all-reduced first
    assert half["self_attn.o_proj"].k == 2048 and not half["self_attn.o_proj"].residual
    assert half["lm_head"].n == 64128  # 128256 is a multiple of 64 already
    gpt2 = {g.layer: g.problem for g in model_gemms(sharded(load_config("gpt2"), 2), 4)}
    assert (gpt2["attn.c_attn"].n, gpt2["attn.c_proj"].k, gpt2["mlp.c_fc"].n, gpt2["mlp.c_proj"].k) == (1152, 384, 1536, 1536)
    assert gpt2["lm_head"].n == 25152 and gpt2["mlp.c_fc"].bias and not gpt2["mlp.c_proj"].bias  # 50257 padded to 50304
    assert {g.layer: g.problem.n for g in model_gemms(sharded(llama, 16), 1)}["self_attn.k_proj"] == 128  # KV replicated
    assert model_gemms(sharded(llama, 1), 16) == model_gemms(llama, 16)
    experts = {g.layer: g.problem for g in model_gemms(sharded(load_config("mixtral-8x7b"), 2), 16)}
    assert experts["mlp.experts.gate_up_proj"].n == 14336 and experts["mlp.experts.down_proj"].k == 7168
    assert experts["mlp.gate (router)"].n == 8  # the router is replicated
    with pytest.raises(ConfigError, match="attention head count, 32, does not split over --tp 3"):
        sharded(llama, 3)
    with pytest.raises(ConfigError, match="its 8 KV heads neither split over nor replicate to --tp 12"):
        sharded(dataclasses.replace(llama, heads=96, intermediate=14336 * 3), 12)
