"""A Hugging Face-style config.json as the named GEMMs one forward pass runs, per token count.

Two schemas are read. Llama's (`hidden_size`, `intermediate_size`, `num_attention_heads`,
`num_key_value_heads`, `head_dim`, `num_hidden_layers`, `vocab_size`, `hidden_act`, and for
MoE `num_local_experts` or `num_experts` with `num_experts_per_tok`), also used by Mistral,
Mixtral, Qwen2 (whose q, k and v projections have biases and o_proj none) and Qwen3; and
GPT-2's (`n_embd`, `n_head`, `n_layer`, `n_inner`, `vocab_size`, `activation_function`),
chosen by `model_type: gpt2` or an `n_embd` field. A config without `model_type` is read by its
`architectures` class names when it has them (a BertModel is refused), else as Llama's; any
other `model_type` (BERT, Phi-3's fused projections, DeepSeek's latent attention:
other GEMMs) is refused rather than read as a Llama it is not. A missing or ill-typed field is
a `ConfigError` that names it.

`sharded(spec, tp)` makes the GEMMs one GPU's share under tensor parallelism, split as vLLM
splits the layers.

Every layer is an `nn.Linear` (y = x W^T with W [out, in] contiguous), so A is row-major and
B column-major; HF's GPT-2 stores its Conv1D weights [in, out] instead, so its layers here are
nanoGPT's. Epilogues follow graphs.suite: the bias where the model has one, the activation
of a non-gated MLP's first projection or a gated MLP's gate projection (only the ones the
template computes exactly: relu, exact gelu, silu), the residual add after the attention
output and the MLP's down projection. MoE experts follow vLLM's fused kernel, as
training/imported.py reads its tuned configs: gate and up fused (N = 2 x expert
intermediate size), T tokens routed to top_k experts each and spread evenly, so a batched GEMM
of min(E, T top_k) experts with ceil(T top_k / E) rows each and no epilogue of its own.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from graphs.problem import GemmProblem

EXAMPLES = Path(__file__).resolve().parent / "data" / "models"
LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # model_types of that schema
QKV_BIAS = ("qwen2", "qwen2_moe")  # q, k and v projections with biases, o_proj without, whatever attention_bias says
# the template fuses these exactly; others (GPT-2's tanh-approximated gelu_new, ...) run unfused
FUSED_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "relu": "relu"}


class ConfigError(ValueError):
    """A model config that cannot be read; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The hyperparameters that set a decoder's GEMM shapes."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    activation: str  # the config's own name for it (hidden_act / activation_function)
    gated: bool  # Llama's gate/up/down MLP, else GPT-2's fc/proj
    bias: bool = False  # attention projections (and, for GPT-2, every layer but lm_head) have biases
    mlp_bias: bool = False
    o_bias: bool | None = None  # the attention output's bias where it differs from `bias` (Qwen2: none)
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # Qwen2-MoE's always-on shared expert
    quantization: str = ""
    tp: int = 1  # tensor-parallel degree: the GEMMs are one GPU's share (`sharded`)


@dataclasses.dataclass(frozen=True)
class ModelGemm:
    """One layer's GEMM at one token count, and how many times a forward pass runs it."""

    layer: str
    problem: GemmProblem
    count: int


def examples() -> dict[str, Path]:
    """The shipped example configs by name (file stem): llama-3-8b, gpt2, mixtral-8x7b."""
    return {p.stem: p for p in sorted(EXAMPLES.glob("*.json"))}


def _field(cfg: dict, name: str, where: str, default: Any = dataclasses.MISSING, kind: type = int) -> Any:
    if name not in cfg or (cfg[name] is None and default is not dataclasses.MISSING):
        if default is dataclasses.MISSING:
            raise ConfigError(f"{where}: field {name!r} is missing")
        return default
    value = cfg[name]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok or (kind is int and value < 1):
        want = "a positive integer" if kind is int else f"a {kind.__name__}"
        raise ConfigError(f"{where}: field {name!r} must be {want}, got {value!r} ({type(value).__name__})")
    return value


def _gpt2(cfg: dict, where: str, name: str) -> ModelSpec:
    hidden = _field(cfg, "n_embd", where)
    heads = _field(cfg, "n_head", where)
    if hidden % heads:
        raise ConfigError(f"{where}: field 'n_embd' ({hidden}) is not a multiple of 'n_head' ({heads})")
    return ModelSpec(name, hidden, _field(cfg, "n_inner", where, 4 * hidden), heads, heads, hidden // heads,
                     _field(cfg, "n_layer", where), _field(cfg, "vocab_size", where),
                     _field(cfg, "activation_function", where, "gelu_new", str), gated=False, bias=True,
                     mlp_bias=True)


def _llama(cfg: dict, where: str, name: str) -> ModelSpec:
    hidden = _field(cfg, "hidden_size", where)
    heads = _field(cfg, "num_attention_heads", where)
    kv = _field(cfg, "num_key_value_heads", where, heads)
    if "head_dim" not in cfg and hidden % heads:
        raise ConfigError(f"{where}: field 'hidden_size' ({hidden}) is not a multiple of "
                          f"'num_attention_heads' ({heads}) and there is no 'head_dim'")
    if heads % kv:
        raise ConfigError(f"{where}: field 'num_key_value_heads' ({kv}) must divide 'num_attention_heads' ({heads})")
    inter = _field(cfg, "intermediate_size", where)
    experts = _field(cfg, "num_local_experts", where, 0) or _field(cfg, "num_experts", where, 0)
    top_k = _field(cfg, "num_experts_per_tok", where) if experts else 0
    if top_k > experts:
        raise ConfigError(f"{where}: field 'num_experts_per_tok' ({top_k}) exceeds the {experts} experts")
    quant = cfg.get("quantization_config") or {}
    qkv_bias = cfg.get("model_type") in QKV_BIAS
    return ModelSpec(
        name, hidden, inter, heads, kv, _field(cfg, "head_dim", where, hidden // heads),
        _field(cfg, "num_hidden_layers", where), _field(cfg, "vocab_size", where),
        _field(cfg, "hidden_act", where, "silu", str), gated=True,
        bias=qkv_bias or _field(cfg, "attention_bias", where, False, bool),
        mlp_bias=_field(cfg, "mlp_bias", where, False, bool), o_bias=False if qkv_bias else None,
        experts=experts, top_k=top_k,
        expert_intermediate=_field(cfg, "moe_intermediate_size", where, inter) if experts else 0,
        shared_intermediate=_field(cfg, "shared_expert_intermediate_size", where, 0) if experts else 0,
        quantization=str(quant.get("quant_method", "quantized")) if quant else "")


def parse_config(cfg: Any, name: str = "model", where: str = "config") -> ModelSpec:
    """The spec of a config.json's parsed content; `where` names it in errors."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: a model config is a JSON object, got {type(cfg).__name__}")
    kind = cfg.get("model_type")
    if kind is None and cfg.get("architectures"):  # older configs name the class instead
        kind = _kind_of_architectures(cfg["architectures"], where)
        cfg = {**cfg, "model_type": kind}
    if kind == "gpt2" or (kind is None and "n_embd" in cfg):
        return _gpt2(cfg, where, name)
    if kind is not None and kind not in LLAMA_LIKE:
        raise ConfigError(f"{where}: model_type {kind!r} is not one whose GEMMs this reads (gpt2, "
                          f"{', '.join(LLAMA_LIKE)}); trace the model instead with --model module:function")
    return _llama(cfg, where, name)


# `architectures` class names (<prefix>ForCausalLM, <prefix>Model, <prefix>LMHeadModel) -> model_type
ARCHITECTURES = (("Qwen2Moe", "qwen2_moe"), ("Qwen3Moe", "qwen3_moe"), ("Qwen2", "qwen2"), ("Qwen3", "qwen3"),
                 ("Mixtral", "mixtral"), ("Mistral", "mistral"), ("Llama", "llama"), ("GPT2", "gpt2"))


def _kind_of_architectures(names: Any, where: str) -> str:
    """The model_type a config without one means by its `architectures`; refused when none is ours."""
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: field 'architectures' must be a list of class names, got {names!r}")
    for name in names:  # exact class names: Llama4ForConditionalGeneration nests its text fields elsewhere
        for prefix, kind in ARCHITECTURES:
            if name in (f"{prefix}ForCausalLM", f"{prefix}Model", f"{prefix}LMHeadModel"):
                return kind
    raise ConfigError(f"{where}: architectures {names} are not ones whose GEMMs this reads (Llama, Mistral, "
                      "Mixtral, Qwen2, Qwen3, GPT-2); trace the model instead with --model module:function")


def config_path(path: str | Path) -> Path:
    """The file a config.json path or a shipped example's name (e.g. 'llama-3-8b') reads."""
    path = Path(path)
    if not path.exists() and str(path) in examples():
        path = examples()[str(path)]
    if not path.is_file():
        raise ConfigError(f"no model config at {path} (shipped examples: {', '.join(examples())})")
    return path


def load_config(path: str | Path) -> ModelSpec:
    """Read a config.json (or a shipped example by name, e.g. 'llama-3-8b')."""
    path = config_path(path)
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    return parse_config(cfg, path.stem, str(path))


def sharded(spec: ModelSpec, tp: int) -> ModelSpec:
    """The spec whose GEMMs are one GPU's share under `tp`-way tensor parallelism, split as vLLM
    splits a model: column-parallel layers (q/k/v, gate/up, GPT-2's c_attn and c_fc, the experts'
    gate_up, lm_head over the vocabulary padded to a multiple of 64, as vLLM pads it) take
    N / tp, row-parallel ones (o_proj, down_proj, c_proj) K / tp and lose their fused residual
    (their partial sums are all-reduced first; vLLM adds the bias in one rank's GEMM, so the
    other ranks' share is the one given here). KV heads fewer than tp are replicated, one a GPU.
    The layers stay the model's own: vLLM runs q/k/v and gate/up as one fused GEMM each (N the
    sum of theirs), which these rows list apart."""
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor-parallel degree must be a positive int, got {tp!r}")
    for what, value in (("attention head count", spec.heads), ("intermediate size", spec.intermediate),
                        ("expert intermediate size", spec.expert_intermediate or tp),
                        ("shared expert intermediate size", spec.shared_intermediate or tp)):
        if value % tp:
            raise ConfigError(f"{spec.name}: its {what}, {value}, does not split over --tp {tp}")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ConfigError(f"{spec.name}: its {spec.kv_heads} KV heads neither split over nor replicate to --tp {tp}")
    return dataclasses.replace(spec, tp=tp)


def _linear(spec: ModelSpec, layer: str, tokens: int, n: int, k: int, dtype: str, count: int, *,
            bias: bool = False, activation: str | None = None, residual: bool = False, batch: int = 1) -> ModelGemm:
    problem = GemmProblem(tokens, n, k, batch=batch, dtype=dtype, b_layout="col", bias=bias,
                          activation=activation, residual=residual, model=spec.name, layer=layer)
    return ModelGemm(layer, problem, count)


def _mlp(spec: ModelSpec, prefix: str, tokens: int, inter: int, dtype: str) -> list[ModelGemm]:
    act, layers, h, inter = FUSED_ACTIVATIONS.get(spec.activation), spec.layers, spec.hidden, inter // spec.tp
    out_bias, out_residual = spec.mlp_bias and spec.tp == 1, spec.tp == 1  # row-parallel: added after the all-reduce
    if not spec.gated:
        return [_linear(spec, f"{prefix}.c_fc", tokens, inter, h, dtype, layers, bias=spec.mlp_bias, activation=act),
                _linear(spec, f"{prefix}.c_proj", tokens, h, inter, dtype, layers, bias=out_bias, residual=out_residual)]
    return [_linear(spec, f"{prefix}.gate_proj", tokens, inter, h, dtype, layers, bias=spec.mlp_bias, activation=act),
            _linear(spec, f"{prefix}.up_proj", tokens, inter, h, dtype, layers, bias=spec.mlp_bias),
            _linear(spec, f"{prefix}.down_proj", tokens, h, inter, dtype, layers, bias=out_bias, residual=out_residual)]


def _experts(spec: ModelSpec, tokens: int, dtype: str) -> list[ModelGemm]:
    rows = tokens * spec.top_k
    m, batch, layers = math.ceil(rows / spec.experts), min(spec.experts, rows), spec.layers
    inter = spec.expert_intermediate // spec.tp  # the router is replicated, the experts split their intermediate
    out = [_linear(spec, "mlp.gate (router)", tokens, spec.experts, spec.hidden, dtype, layers),
           _linear(spec, "mlp.experts.gate_up_proj", m, 2 * inter, spec.hidden, dtype, layers, batch=batch),
           _linear(spec, "mlp.experts.down_proj", m, spec.hidden, inter, dtype, layers, batch=batch)]
    if spec.shared_intermediate:
        out += _mlp(spec, "mlp.shared_expert", tokens, spec.shared_intermediate, dtype)
    return out


def model_gemms(spec: ModelSpec, tokens: int, dtype: str = "bf16") -> list[ModelGemm]:
    """Every weight GEMM of one forward pass over `tokens` tokens, in layer order."""
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive int, got {tokens!r}")
    h, layers, tp, whole = spec.hidden, spec.layers, spec.tp, spec.tp == 1
    o_bias = (spec.bias if spec.o_bias is None else spec.o_bias) and whole
    if spec.gated:
        q, kv = spec.heads * spec.head_dim // tp, max(spec.kv_heads // tp, 1) * spec.head_dim
        attn = [_linear(spec, "self_attn.q_proj", tokens, q, h, dtype, layers, bias=spec.bias),
                _linear(spec, "self_attn.k_proj", tokens, kv, h, dtype, layers, bias=spec.bias),
                _linear(spec, "self_attn.v_proj", tokens, kv, h, dtype, layers, bias=spec.bias),
                _linear(spec, "self_attn.o_proj", tokens, h, q, dtype, layers, bias=o_bias, residual=whole)]
    else:
        attn = [_linear(spec, "attn.c_attn", tokens, 3 * h // tp, h, dtype, layers, bias=spec.bias),
                _linear(spec, "attn.c_proj", tokens, h, h // tp, dtype, layers, bias=o_bias, residual=whole)]
    mlp = _experts(spec, tokens, dtype) if spec.experts else _mlp(spec, "mlp", tokens, spec.intermediate, dtype)
    vocab = spec.vocab if whole else -(-spec.vocab // 64) * 64 // tp  # vLLM's padded vocabulary, split
    return attn + mlp + [_linear(spec, "lm_head", tokens, vocab, h, dtype, 1)]


def skipped(spec: ModelSpec) -> list[tuple[str, str]]:
    """(what, why) for the parts of the model this tuning leaves out or runs differently."""
    out = [("attention scores and values (Q K^T, P V)",
            "their shapes follow the context length; the attention kernel runs them")]
    if spec.activation not in FUSED_ACTIVATIONS:
        out.append((f"activation {spec.activation}", "the template computes relu, exact gelu and silu; "
                    "this one runs unfused after its GEMM"))
    if spec.quantization:
        out.append((f"{spec.quantization} weights", "the template runs fp16, bf16 and fp32; tuned as 16-bit GEMMs"))
    return out
