"""GemmProblem and the inputs made for it."""
import pytest
import torch

from graphs import GemmProblem
from gnn_policy.measure.inputs import make_inputs


def test_key_and_flops():
    p = GemmProblem(16, 4096, 4096, dtype="bf16", bias=True, activation="gelu", model="llama", layer="up")
    assert p.key == "1x16x4096x4096_bf16_rr_bgelu"
    assert p.flops == 2 * 16 * 4096 * 4096
    assert GemmProblem(16, 4096, 4096, dtype="bf16", bias=True, activation="gelu").key == p.key
    assert p.bytes_min() == 2 * (16 * 4096 + 4096 * 4096 + 16 * 4096 + 4096)


def test_from_key_inverts_key_over_the_whole_suite():
    from graphs.suite import suite

    problems = [p for ps in suite().values() for p in ps]
    assert {p.key for p in problems} == {GemmProblem.from_key(p.key).key for p in problems}
    p = GemmProblem(5, 7, 9, batch=3, dtype="fp16", a_layout="col", bias=True, activation="relu", residual=True)
    assert GemmProblem.from_key(p.key) == p


@pytest.mark.parametrize("key", ["1x4x4_bf16_rr", "1x4x4x4_bf16_rr_", "1x4x4x4_bf16_rx", "1x4x4x4_bf16_rr_tanh",
                                 "1x4x4x4_fp8_rr"])
def test_from_key_refuses_what_no_problem_is_named(key):
    with pytest.raises(ValueError):
        GemmProblem.from_key(key)


@pytest.mark.parametrize("bad", [dict(m=0), dict(m=True), dict(dtype="fp8"), dict(a_layout="diag"),
                                 dict(activation="tanh")])
def test_validation(bad):
    with pytest.raises(ValueError):
        GemmProblem(**(dict(m=4, n=4, k=4) | bad))


def test_inputs_follow_the_layouts():
    p = GemmProblem(5, 7, 9, batch=3, dtype="fp16", a_layout="col", b_layout="row", bias=True, residual=True)
    args = make_inputs(p, "cpu", seed=0)
    a, b = args["a"], args["b"]
    assert a.shape == (3, 5, 9) and a.stride(-2) == 1      # column-major A
    assert b.shape == (3, 9, 7) and b.stride(-1) == 1      # row-major B
    assert args["bias"].shape == (7,) and args["residual"].shape == (3, 5, 7)
    again = make_inputs(p, "cpu", seed=0)
    assert torch.equal(again["a"], a) and not torch.equal(make_inputs(p, "cpu", seed=1)["a"], a)


def test_output_scale_does_not_grow_with_k():
    for k in (16, 4096):
        args = make_inputs(GemmProblem(64, 64, k, dtype="fp32"), "cpu", seed=0)
        std = (args["a"] @ args["b"]).std().item()
        assert 0.7 < std < 1.3
