"""One transformer block built from a model config, with random weights: what `patch` is measured on.

`LlamaBlock` (RMSNorm, rotary embeddings, grouped-query attention, SiLU-gated MLP) and
`GPT2Block` (nanoGPT's: LayerNorm, fused q/k/v, exact GELU MLP) name their layers as
graphs.model_config does (`self_attn.q_proj`, `mlp.c_fc`, ...), so a captured block and its
config's rows line up. Both trace with torch.fx. The block runs T tokens with causal attention
and no KV cache: a prefill of T tokens. GPT-2's own GELU is the tanh approximation; nanoGPT's
exact one is used here, which the template fuses.

`llama_block` and `gpt2_block` are `tune --model` functions: `(module, example inputs)` for a
token count, on the meta device by default, so tracing a full-size block costs no memory.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from graphs.model_config import ModelSpec, load_config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaBlock(nn.Module):
    """A Llama-style decoder layer; x [batch, T, hidden] -> the same shape."""

    def __init__(self, spec: ModelSpec, max_tokens: int = 2048, rope_theta: float = 500000.0):
        super().__init__()
        if spec.experts or not spec.gated:
            raise ValueError(f"LlamaBlock needs a dense gated-MLP config; {spec.name} is not one")
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        h, q, kv, bias = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.bias
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h), RMSNorm(h)
        self.self_attn = nn.ModuleDict({"q_proj": nn.Linear(h, q, bias=bias), "k_proj": nn.Linear(h, kv, bias=bias),
                                        "v_proj": nn.Linear(h, kv, bias=bias), "o_proj": nn.Linear(q, h, bias=bias if spec.o_bias is None else spec.o_bias)})
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(h, spec.intermediate, bias=spec.mlp_bias),
                                  "up_proj": nn.Linear(h, spec.intermediate, bias=spec.mlp_bias),
                                  "down_proj": nn.Linear(spec.intermediate, h, bias=spec.mlp_bias)})
        freqs = rope_theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        angles = torch.outer(torch.arange(max_tokens, dtype=torch.float32), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        attn, mlp = self.self_attn, self.mlp
        h = self.input_layernorm(x)
        q = attn["q_proj"](h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = attn["k_proj"](h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn["v_proj"](h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = torch.narrow(self.cos, 0, 0, t).to(x.dtype), torch.narrow(self.sin, 0, 0, t).to(x.dtype)
        y = F.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + attn["o_proj"](y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        h = self.post_attention_layernorm(x)
        return x + mlp["down_proj"](F.silu(mlp["gate_proj"](h)) * mlp["up_proj"](h))


class GPT2Block(nn.Module):
    """A GPT-2-style block as nanoGPT writes it; x [batch, T, hidden] -> the same shape."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.gated:
            raise ValueError(f"GPT2Block needs a GPT-2-style config; {spec.name} is not one")
        self.heads, self.hidden = spec.heads, spec.hidden
        h = spec.hidden
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(h, 3 * h), "c_proj": nn.Linear(h, h)})
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(h, spec.intermediate), "act": nn.GELU(),
                                  "c_proj": nn.Linear(spec.intermediate, h)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn["c_attn"](self.ln_1(x)).split(self.hidden, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn["c_proj"](y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp["c_proj"](self.mlp["act"](self.mlp["c_fc"](self.ln_2(x))))


def build(config: str | ModelSpec, tokens: int, *, device: str | torch.device = "meta",
          dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The config's block (Llama-style if its MLP is gated, else GPT-2-style) in eval mode, random
    weights, and one input of `tokens` tokens."""
    spec = config if isinstance(config, ModelSpec) else load_config(config)
    torch.manual_seed(seed)
    with torch.device(device):
        block = LlamaBlock(spec, max_tokens=max(tokens, 1)) if spec.gated else GPT2Block(spec)
    block = block.to(dtype).eval()
    x = torch.randn(1, tokens, spec.hidden, device=device, dtype=dtype)
    return block, (x,)


def llama_block(tokens: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The shipped Llama-3-8B config's block, on the meta device (for `tune --model`)."""
    return build("llama-3-8b", tokens)


def gpt2_block(tokens: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The shipped GPT-2 config's block, on the meta device (for `tune --model`)."""
    return build("gpt2", tokens)
