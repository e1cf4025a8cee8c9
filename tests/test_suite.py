"""The benchmark suite: real layers, real epilogues, splits by family that do not leak."""
import pytest

from graphs.suite import M_GRID, SPLITS, family_problems, split, suite


def _layer(family, layer, **kw):
    return [p for p in family_problems(family) if p.layer == layer and all(getattr(p, k) == v for k, v in kw.items())]


def test_splits_are_disjoint_and_cover_every_family():
    s = suite()
    keys = {name: {p.key for p in ps} for name, ps in s.items()}
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"] and not keys["val"] & keys["test"]
    for name, families in SPLITS.items():
        assert {p.model for p in s[name]} == set(families)
    assert min(len(ps) for ps in s.values()) > 300


def test_every_problem_has_both_dtypes_and_the_m_grid():
    ps = _layer("Qwen2-7B", "down_proj")
    assert {p.dtype for p in ps} == {"bf16", "fp16"}
    assert sorted({p.m for p in ps}) == list(M_GRID)


def test_epilogues_follow_the_models():
    assert _layer("GPT-2-small", "mlp.c_fc", activation="gelu", bias=True)
    assert _layer("T5-base", "DenseReluDense.wi", activation="relu", bias=False)
    assert _layer("Llama-3-8B", "o_proj", residual=True, bias=False)
    assert _layer("Qwen2-7B", "q_proj", bias=True) and not _layer("Qwen2-7B", "o_proj", bias=True)
    assert _layer("Llama-3-8B", "gate_proj / up_proj (each)", activation="silu")
    assert not _layer("Mixtral-8x7B", "expert w2 (down, per expert)", residual=True)


def test_mixtral_experts_run_at_tokens_times_topk_over_experts():
    rows = sorted({p.m for p in _layer("Mixtral-8x7B", "expert w2 (down, per expert)")})
    assert rows == sorted({max(1, -(-m * 2 // 8)) for m in M_GRID})


def test_tensor_parallel_shards_divide_the_right_dimension():
    q = _layer("Llama-3-70B-TP8", "q_proj")[0]
    down = _layer("Llama-3-70B-TP8", "down_proj")[0]
    assert (q.n, q.k) == (8192 // 8, 8192) and (down.n, down.k) == (8192, 28672 // 8)


def test_unknown_split():
    with pytest.raises(KeyError, match="train"):
        split("holdout")
