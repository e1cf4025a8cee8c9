"""gnn_policy.patch / unpatch on tiny blocks built from configs, through Triton's interpreter."""
import warnings

import pytest
import torch
import torch.nn as nn

import gnn_policy
from graphs.model_config import ModelSpec
from gnn_policy import ops, patching
from gnn_policy.benchmarks.blocks import build
from gnn_policy.kernels.reference import TOLERANCE, relative_error
from gnn_policy.patching import TritonLinear

LLAMA = ModelSpec("tiny-llama", hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, layers=1, vocab=64,
                  activation="silu", gated=True)
GPT2 = ModelSpec("tiny-gpt2", hidden=32, intermediate=64, heads=4, kv_heads=4, head_dim=8, layers=1, vocab=64,
                 activation="gelu", gated=False, bias=True, mlp_bias=True)


@pytest.fixture(autouse=True)
def fresh_warnings():
    patching._WARNED.clear()
    yield
    patching._WARNED.clear()


def _fused(model):
    return {name: (m.activation, m.residual) for name, m in model.named_modules() if isinstance(m, TritonLinear)}


@pytest.mark.parametrize("spec, fused", [
    (LLAMA, {"self_attn.q_proj": (None, False), "self_attn.k_proj": (None, False), "self_attn.v_proj": (None, False),
             "self_attn.o_proj": (None, True), "mlp.gate_proj": ("silu", False), "mlp.up_proj": (None, False),
             "mlp.down_proj": (None, True)}),
    (GPT2, {"attn.c_attn": (None, False), "attn.c_proj": (None, True), "mlp.c_fc": ("gelu", False),
            "mlp.c_proj": (None, True)}),
])
def test_patched_blocks_match_torch_and_unpatch_restores(spec, fused):
    block, (x,) = build(spec, 5, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        want = block(x)
        patched = gnn_policy.patch(block)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="gnn_policy.patch")  # nothing falls back
            got = patched(x)
    assert _fused(patched) == fused
    assert relative_error(got, want.double()) < TOLERANCE[torch.float32]
    assert gnn_policy.unpatch(patched) is block
    assert not _fused(block) and type(block.self_attn["q_proj"] if spec.gated else block.attn["c_attn"]) is nn.Linear


def test_fp16_runs_the_policys_pick_cached_per_shape():
    ops.policy_config.cache_clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16)).half()
    x = torch.randn(6, 32, dtype=torch.float16)
    with torch.inference_mode():
        want = model(x)
        patched = gnn_policy.patch(model)
        got = patched(x)
        patched(x)
    assert _fused(patched) == {"0": ("gelu", False), "2": (None, False)}
    assert relative_error(got, want.double()) < TOLERANCE[torch.float16]
    assert ops.policy_config.cache_info().currsize == 2  # one pick per shape, reused by the second call


def test_a_repeated_call_skips_matmuls_checks_and_a_new_layout_is_checked_again(monkeypatch):
    torch.manual_seed(0)
    layer = TritonLinear(nn.Linear(32, 48).half())
    x = torch.randn(6, 32, dtype=torch.float16)
    col = x.t().contiguous().t()  # the same values, column-major
    seen = []
    checked = ops.matmul_and_config
    monkeypatch.setattr(ops, "matmul_and_config", lambda *a, **kw: seen.append(a[0].stride()) or checked(*a, **kw))
    with torch.inference_mode():
        first, again, by_col = layer(x), layer(x), layer(col)
        layer(col)
    want = nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    assert torch.equal(first, again)
    assert relative_error(again, want) < TOLERANCE[torch.float16]
    assert relative_error(by_col, want) < TOLERANCE[torch.float16]
    assert seen == [(32, 1), (1, 6)]  # each layout checked once; the repeats went straight to the launch
    assert len(layer._plans) == 2


def test_the_plans_of_a_layer_start_over_past_their_bound(monkeypatch):
    monkeypatch.setattr(patching, "MAX_PLANS", 3)
    layer = TritonLinear(nn.Linear(16, 8).half())
    with torch.inference_mode():
        for rows in range(1, 6):
            out = layer(torch.randn(rows, 16, dtype=torch.float16))
            assert out.shape == (rows, 8)
    assert len(layer._plans) == 2  # cleared at the fourth distinct shape, then two more


def test_autograd_falls_back_to_torch_with_one_warning():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    patched = gnn_policy.patch(model)
    x = torch.randn(3, 16)
    with pytest.warns(UserWarning, match="no backward pass") as record:
        y = patched(x)
        patched(x)
    assert len([w for w in record if "gnn_policy.patch" in str(w.message)]) == 1
    y.sum().backward()  # torch's ops ran: gradients flow
    assert model[0].weight.grad is not None
    with pytest.warns(UserWarning, match="float64"):
        with torch.no_grad():
            assert torch.equal(patched.double()(x.double()), model(x.double()))


def test_an_untraceable_model_is_patched_in_place_without_fusion():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.fc(x)) if x.sum() > 0 else self.fc(x)

    model = Branchy()
    linear = model.fc
    with pytest.warns(UserWarning, match="cannot trace Branchy"):
        patched = gnn_policy.patch(model)
    assert patched is model and _fused(model) == {"fc": (None, False)}
    assert set(model.state_dict()) == {"fc.weight", "fc.bias"}  # the parameters once, under their names
    x = torch.ones(2, 8)
    with torch.no_grad():
        assert relative_error(model(x), torch.relu(linear(x)).double()) < TOLERANCE[torch.float32]
    with pytest.raises(ValueError, match="already patched"):
        gnn_policy.patch(model)
    assert gnn_policy.unpatch(model).fc is linear


def test_bf16_and_autocast_on_the_cpu_fall_back_to_torch_with_a_warning():
    """The interpreter's bf16 products are wrong, and autocast's casts are torch's: both run
    torch's ops, with the reason named once, and give torch's result and dtype."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    x = torch.randn(3, 16)
    with torch.no_grad():
        patched = gnn_policy.patch(model.bfloat16())
        with pytest.warns(UserWarning, match="interpreter computes bf16 products wrongly"):
            got = patched(x.bfloat16())
        assert torch.equal(got, model(x.bfloat16()))
        patched = gnn_policy.patch(model.float())
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="autocast is on"):
            got = patched(x)
            want = model(x)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)


def test_a_trainable_bias_or_residual_falls_back_even_after_a_no_grad_call():
    """A frozen weight with a trainable bias (or a LoRA-style residual) needs torch's autograd,
    also for a call signature the layer has already run under no_grad."""
    layer = TritonLinear(nn.Linear(16, 8).half())
    layer.weight.requires_grad_(False)
    x = torch.randn(4, 16, dtype=torch.float16)
    with torch.no_grad():
        layer(x)
        layer(x)
    with pytest.warns(UserWarning, match="no backward pass"):
        y = layer(x)
    y.float().sum().backward()
    assert layer.bias.grad is not None and layer.bias.grad.shape == (8,)
    fused = TritonLinear(nn.Linear(16, 8).half(), residual=True).requires_grad_(False)
    r = torch.randn(4, 8, dtype=torch.float16, requires_grad=True)
    fused(x, r).float().sum().backward()
    assert r.grad is not None and torch.equal(r.grad, torch.ones_like(r))


def test_a_patched_layer_copies_and_pickles_without_its_plans():
    import copy
    import io
    import threading

    layer = TritonLinear(nn.Linear(16, 8).half())
    with torch.no_grad():
        want = layer(torch.ones(2, 16, dtype=torch.float16))
    # a lock neither pickles nor deep-copies, like the compiled kernel a plan holds
    layer._plans[("a", "signature")] = (None, threading.Lock())
    twin = copy.deepcopy(layer)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (twin, loaded):
        assert other._plans == {} and torch.equal(other.weight, layer.weight)
        with torch.no_grad():
            assert torch.equal(other(torch.ones(2, 16, dtype=torch.float16)), want)
    assert ("a", "signature") in layer._plans  # the original keeps its own


def test_patch_picks_from_a_named_checkpoint_and_refuses_one_that_is_not_there(tmp_path):
    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy, save_checkpoint

    h200 = hardware_specs.load("h200")  # the rules the interpreter applies
    problem = GemmProblem(6, 48, 32, dtype="fp16", b_layout="col", bias=True)  # nn.Linear's weight, 6 tokens
    shipped = Policy.load(DEFAULT_CHECKPOINT)
    winner = shipped.top_k(problem, h200, 4)[3].config  # what the shipped policy ranks fourth
    tuned = tmp_path / "tuned.pt"
    save_checkpoint(shipped.model, tuned, shipped.members, measured={h200.name: {problem.key: (winner.key, 1.0)}})
    torch.manual_seed(0)
    layer = nn.Linear(32, 48).half()
    x = torch.randn(6, 32, dtype=torch.float16)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        gnn_policy.patch(layer, checkpoint=tmp_path / "missing.pt")
    with torch.inference_mode():
        want = layer(x)
        patched = gnn_policy.patch(layer, checkpoint=tuned)
        got = patched(x)
        default = gnn_policy.patch(nn.Linear(32, 48).half())
        default(x)
    assert [config for config, _ in patched._plans.values()] == [winner]  # the fine-tune's measured winner
    assert [config for config, _ in default._plans.values()] != [winner]
    assert relative_error(got, want.double()) < TOLERANCE[torch.float16]
