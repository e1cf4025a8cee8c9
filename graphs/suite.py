"""The benchmark suite: GEMMs of real models, with the epilogue each layer really has.

Built from `graphs/data/model_gemm_shapes.json` (linear layers y = x W^T, W [N, K], so
(M x K) @ (K x N) with M = tokens). Each layer becomes one problem per M of `M_GRID` and per
dtype; Mixtral's expert GEMMs run at tokens * topk / experts rows. Llama-3-70B also appears
as its tensor-parallel-8 shards (column-parallel layers divide N, row-parallel divide K).

Splits are by model family, so test shapes come from models never trained on. A computation
(shape, dtype, layout, epilogue) that a training family also has is dropped from validation
and test: sharing it would leak the answer (GPT-2, BERT and ViT share 768/3072 layers, Mistral
shares Llama-3-8B's). SPLITS below is the one definition.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from graphs.problem import GemmProblem

DATA = Path(__file__).resolve().parent / "data" / "model_gemm_shapes.json"
M_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DTYPES = ("bf16", "fp16")
TP8 = "Llama-3-70B-TP8"
SPLITS = {
    "train": ("Llama-3-8B", "Mistral-7B-v0.1", "Mixtral-8x7B", "GPT-2-small", "BERT-base", "ViT-B/16"),
    "val": ("Llama-3-70B", TP8),
    "test": ("Qwen2-7B", "T5-base"),
}
# Layers with biases: GPT-2, BERT and ViT everywhere, Qwen2 on q/k/v only.
_BIASED_MODELS = ("GPT-2-small", "BERT-base", "ViT-B/16")


def _epilogues(model: dict, name: str, layer: str) -> list[tuple[bool, str | None, bool]]:
    """(bias, activation, residual) variants of one layer, from what the model computes next.

    Gated MLPs (silu(gate) * up) apply SiLU to the gate projection alone; a fused gate_up
    GEMM has no element-wise epilogue of its own. Output projections add the residual
    stream; BERT's pooler tanh is not an epilogue we fuse, so it keeps only its bias.
    """
    low = layer.lower()
    bias = name in _BIASED_MODELS or (model.get("qkv_bias", False) and any(
        t in low for t in ("q_proj", "k_proj", "v_proj", "qkv")))
    act = model["act"]
    if "lm_head" in low or "decoder" in low or "classifier" in low or "router" in low:
        return [(name in _BIASED_MODELS and "classifier" in low or "decoder" in low, None, False)]
    if "q/k/v/o" in low:  # T5 lists q, k, v and o together: o adds the residual
        return [(bias, None, False), (bias, None, True)]
    # Mixtral's expert down projection (w2) is weighted and summed over experts before the
    # residual add, so it has no epilogue of its own.
    residual = any(t in low for t in ("o_proj", "c_proj", "output.dense", "down_proj", ".wo", "fc2"))
    if "gate_proj / up_proj" in low:
        return [(bias, "silu", False), (bias, None, False)]
    if act == "gelu" and any(t in low for t in ("c_fc", "intermediate", "transform")):
        return [(bias, "gelu", False)]
    if act == "relu" and ".wi" in low:
        return [(bias, "relu", False)]
    return [(bias, None, residual)]


def _layers() -> list[tuple[str, dict, dict]]:
    """(family, model config, gemm entry), with the TP-8 shards of Llama-3-70B added."""
    data = json.loads(DATA.read_text())
    out = []
    for g in data["gemms"]:
        out.append((g["model"], data["models"][g["model"]], g))
        if g["model"] == "Llama-3-70B":
            row_parallel = any(t in g["layer"] for t in ("o_proj", "down_proj"))
            shard = dict(g, N=g["N"] if row_parallel else g["N"] // 8, K=g["K"] // 8 if row_parallel else g["K"])
            out.append((TP8, data["models"]["Llama-3-70B"], shard))
    return out


def _rows(model: dict, entry: dict) -> list[int]:
    if "expert" in entry["layer"]:
        return sorted({max(1, math.ceil(m * model["topk"] / model["experts"])) for m in M_GRID})
    return list(M_GRID)


def family_problems(family: str) -> list[GemmProblem]:
    """Every problem of one model family, deduplicated, in a stable order."""
    seen: dict[str, GemmProblem] = {}
    for name, model, entry in _layers():
        if name != family:
            continue
        for bias, act, res in _epilogues(model, name, entry["layer"]):
            for m in _rows(model, entry):
                for dtype in DTYPES:
                    p = GemmProblem(m, entry["N"], entry["K"], dtype=dtype, bias=bias, activation=act,
                                    residual=res, model=name, layer=entry["layer"])
                    seen.setdefault(p.key, p)
    return list(seen.values())


def split(name: str) -> list[GemmProblem]:
    """The problems of one split: its families' problems, minus computations an earlier split has."""
    if name not in SPLITS:
        raise KeyError(f"unknown split {name!r}; known: {sorted(SPLITS)}")
    earlier: set[str] = set()
    for other in SPLITS:
        problems = [p for fam in SPLITS[other] for p in family_problems(fam)]
        unique = list({p.key: p for p in problems if p.key not in earlier}.values())
        if other == name:
            return unique
        earlier.update(p.key for p in unique)
    raise AssertionError("unreachable")


def suite() -> dict[str, list[GemmProblem]]:
    return {name: split(name) for name in SPLITS}
