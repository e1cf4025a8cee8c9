"""The Triton template through the interpreter: correctness against torch and error messages.

Shapes stay <= ~128 (the interpreter runs every program in Python); bf16 is checked on the
GPU only, because the interpreter's bf16 `tl.dot` multiplies raw bits (test_kernel_gpu.py).
"""
import os
import subprocess
import sys

import pytest
import torch

from graphs import GemmProblem
from gnn_policy import InvalidConfigError, TileConfig, matmul, space
from gnn_policy.kernels.launch import launch
from gnn_policy.kernels.reference import TOLERANCE, reference, relative_error
from gnn_policy.measure.inputs import TORCH_DTYPES, make_inputs
from gnn_policy.ops import INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="CPU kernel tests run under TRITON_INTERPRET=1")

P, T = GemmProblem, TileConfig
# (problem, config): together they use every value of every knob (checked below).
CASES = [
    (P(33, 20, 40, dtype="fp16"), T(256, 16, 16, 1, 1, 8, 1, "ptr")),
    (P(20, 104, 48, dtype="fp16", bias=True), T(16, 256, 32, 2, 4, 4, 2, "tma")),
    (P(7, 16, 100, dtype="fp32", activation="relu"), T(16, 16, 256, 1, 8, 2, 3, "ptr")),
    (P(16, 32, 256, dtype="fp32"), T(16, 32, 16, 16, 16, 2, 6, "tma")),
    (P(100, 33, 128, dtype="fp16", activation="gelu", residual=True), T(128, 64, 16, 8, 16, 8, 5, "ptr")),
    (P(1, 7, 1, dtype="fp32"), T(16, 16, 16, 1, 4, 2, 4, "ptr")),
    (P(64, 64, 192, dtype="fp16", a_layout="col", b_layout="col", activation="silu"), T(32, 64, 64, 3, 1, 4, 3, "tma")),
    (P(24, 40, 72, batch=3, dtype="fp16", a_layout="col", bias=True), T(16, 16, 32, 2, 8, 2, 2, "tma")),
    (P(50, 30, 140, batch=2, dtype="fp32", b_layout="col", residual=True), T(32, 32, 32, 4, 4, 4, 2, "ptr")),
    (P(128, 128, 96, dtype="fp16", bias=True, activation="gelu"), T(64, 128, 128, 1, 8, 8, 3, "tma")),
    # the persistent variants: a few programs loop over every (batch, tile, K slice) unit
    (P(70, 50, 72, batch=2, dtype="fp16", b_layout="col", bias=True, activation="silu"),
     T(32, 16, 16, 2, 4, 4, 2, "persistent")),
    (P(65, 40, 64, dtype="fp16", b_layout="col", residual=True), T(64, 32, 32, 1, 8, 4, 3, "warpspec")),
    (P(33, 48, 104, batch=3, dtype="fp16", activation="gelu"), T(64, 16, 32, 1, 1, 4, 2, "warpspec")),
    # C in two TMA-stored halves: batches folded into the store's rows, and after a split-K sum
    (P(64, 96, 80, batch=2, dtype="fp16", bias=True, activation="relu", residual=True),
     T(32, 32, 16, 1, 4, 4, 3, "subtile")),
    (P(70, 64, 48, dtype="fp32", b_layout="col"), T(16, 64, 16, 2, 8, 2, 2, "subtile")),
    # stream-K: 4 programs share 3 tiles x 5 K tiles x 2 batches, so tiles are cut between programs
    (P(40, 24, 80, batch=3, dtype="fp16", a_layout="col", bias=True, activation="gelu", residual=True),
     T(32, 32, 16, 1, 1, 4, 2, "streamk")),
    (P(100, 48, 68, dtype="fp32", b_layout="col"), T(64, 16, 32, 1, 4, 2, 3, "streamk")),
]


@pytest.mark.parametrize("programs", [1, 3, 7, 64])
def test_streamk_cuts_tiles_anywhere_and_stays_correct(programs):
    """12 tiles of 9 K tiles: whole waves but the last one or two go data-parallel (1 and 3
    programs), the rest is cut into equal runs that start and end mid-tile (7: two parts a tile;
    64: more programs than the iterations need, five parts)."""
    from gnn_policy.kernels.persistent import streamk_split

    problem = P(50, 40, 140, batch=2, dtype="fp32", bias=True, activation="silu")
    config = T(32, 16, 16, 1, 4, 4, 2, "streamk")
    args = make_inputs(problem, "cpu", seed=programs)
    out = launch(args["a"], args["b"], config, bias=args["bias"], activation="silu", residual=None,
                 programs=programs)
    assert relative_error(out, reference(**args)) <= TOLERANCE[torch.float32]
    used, dp, per, parts = streamk_split(config, 50, 40, 140, 2, programs)
    assert used == programs and dp % used == 0 and (dp > 0) == (programs <= 6) and 12 - dp < 2 * used
    owners = [i // per for i in range((12 - dp) * 9)]  # stream-K iteration -> program
    assert owners[-1] < used and per == -(-(12 - dp) * 9 // used)
    assert parts == max(len(set(owners[t * 9:(t + 1) * 9])) for t in range(12 - dp))
    assert parts == {1: 1, 3: 1, 7: 2, 64: 5}[programs]


def test_cases_cover_every_knob_value():
    for name, values in space("hopper-all").values.items():
        used = {getattr(c, name) for _, c in CASES}
        assert set(values) <= used, f"{name}: {set(values) - used} never used"


def _check(problem, config, seed=0):
    args = make_inputs(problem, "cpu", seed=seed)
    out = matmul(**args, config=config)
    assert out.shape == reference(**args).shape and out.dtype == args["a"].dtype
    err = relative_error(out, reference(**args))
    assert err <= TOLERANCE[TORCH_DTYPES[problem.dtype]], (problem.key, config.key, err)


@pytest.mark.parametrize("problem,config", CASES, ids=[f"{p.key}-{c.key}" for p, c in CASES])
def test_matches_torch(problem, config, monkeypatch):
    if config.variant == "warpspec":  # refused on Hopper, where it hangs: the B200's rules admit it
        monkeypatch.setenv("GNN_POLICY_GPU", "b200")
    _check(problem, config)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 33, 100), (100, 7, 33), (33, 100, 7)])
def test_odd_sizes_default_config(m, n, k):
    _check(P(m, n, k, dtype="fp16", bias=True), None)


def test_broadcast_weight_over_batch():
    a = torch.randn(3, 20, 32, dtype=torch.float16)
    b = torch.randn(32, 24, dtype=torch.float16)
    for variant in ("ptr", "tma"):
        out = matmul(a, b, config=T(16, 16, 16, 2, 1, 2, 2, variant))
        assert out.shape == (3, 20, 24)
        assert relative_error(out, reference(a, b)) < 1e-2


def test_every_element_is_written():
    args = make_inputs(P(40, 48, 64, dtype="fp32"), "cpu", seed=1)
    out = torch.full((40, 48), float("nan"))
    launch(args["a"], args["b"], T(32, 32, 16, 4, 8, 2, 2, "tma"), bias=None, activation=None,
           residual=None, out=out)
    assert torch.isfinite(out).all() and relative_error(out, reference(args["a"], args["b"])) < 1e-5


def test_split_k_counters_are_left_at_zero():
    from gnn_policy.kernels.launch import tile_counters

    for problem, config in CASES[3:5]:  # split-K 16 and 8
        _check(problem, config)
        assert not tile_counters(torch.device("cpu"), 1).any()


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")  # the masked-out inf products
def test_batched_tma_k_tail_does_not_read_the_next_batch():
    # K=24 is not whole BLOCK_K=16 tiles; batch 1's B is inf, batch 0 must not see it.
    a = torch.randn(2, 24, 32, dtype=torch.float16).transpose(1, 2)
    b = torch.randn(2, 24, 40, dtype=torch.float16)
    b[1] = float("inf")
    out = matmul(a, b, config=T(16, 16, 16, 1, 4, 2, 2, "tma"))
    assert relative_error(out[0], reference(a[0], b[0])) < 1e-2


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")
def test_batched_tma_k_tail_does_not_read_the_next_batch_of_a():
    # Column-major A: its K runs along the descriptor's rows, folded across batches.
    a = torch.randn(2, 24, 32, dtype=torch.float16).transpose(1, 2)
    a[1] = float("inf")
    b = torch.randn(2, 24, 40, dtype=torch.float16)
    out = matmul(a, b, config=T(16, 16, 16, 1, 4, 2, 2, "tma"))
    assert relative_error(out[0], reference(a[0], b[0])) < 1e-2


def test_tma_refuses_layouts_it_cannot_describe():
    x = torch.randn(16, 3, 32, dtype=torch.float16).permute(1, 0, 2)  # batches not contiguous rows
    b = torch.randn(3, 32, 16, dtype=torch.float16)
    with pytest.raises(InvalidConfigError, match=r"\[tma-batch-stride\]"):
        matmul(x, b, config=T(16, 16, 16, variant="tma"))
    assert relative_error(matmul(x, b, config=T(16, 16, 16)), reference(x, b)) < 1e-2
    strided = torch.randn(32, 64, dtype=torch.float16)[::2, ::2]  # no unit-stride dimension
    with pytest.raises(InvalidConfigError, match=r"\[tma-layout\]"):
        matmul(strided, torch.randn(32, 16, dtype=torch.float16), config=T(16, 16, 16, variant="tma"))


def test_empty_batch_gives_an_empty_result():
    out = matmul(torch.randn(0, 8, 16, dtype=torch.float16), torch.randn(16, 24, dtype=torch.float16))
    assert out.shape == (0, 8, 24)


def test_offsets_past_int32_are_refused():
    big = torch.empty(3, 2**20, 1024, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="2\\*\\*31 elements"):
        matmul(big, torch.empty(1024, 8, dtype=torch.float16, device="meta"))


def test_gnn_policy_gpu_names_the_rules(monkeypatch):
    monkeypatch.setenv("GNN_POLICY_GPU", "l4")
    with pytest.raises(InvalidConfigError, match=r"\[tma\] L4 has no Tensor Memory Accelerator"):
        _raises_config(T(16, 16, 16, variant="tma"))


def _raises(match, exc=ValueError, **kw):
    base = dict(a=torch.randn(8, 16, dtype=torch.float16), b=torch.randn(16, 24, dtype=torch.float16))
    with pytest.raises(exc, match=match):
        matmul(**(base | kw))


def test_error_messages():
    _raises(r"shape mismatch: a \(8, 16\) has K=16 but b \(12, 24\) has K=12", b=torch.randn(12, 24, dtype=torch.float16))
    _raises("unsupported dtype torch.float64", TypeError, a=torch.randn(8, 16, dtype=torch.float64))
    _raises("unsupported dtype torch.int32", TypeError, b=torch.ones(16, 24, dtype=torch.int32))
    _raises("a is torch.float16 but b is torch.float32", TypeError, b=torch.randn(16, 24))
    _raises("different devices: a on cpu, b on meta", b=torch.empty(16, 24, dtype=torch.float16, device="meta"))
    _raises(r"bias must have shape \(24,\)", bias=torch.randn(8, dtype=torch.float16))
    _raises("residual of shape", residual=torch.randn(3, 24, dtype=torch.float16))
    _raises("unknown activation 'tanh'", activation="tanh")
    _raises("unknown activation \\['relu'\\]", activation=["relu"])
    _raises("must be 2-D or 3-D", a=torch.randn(16, dtype=torch.float16))
    _raises("batch mismatch", a=torch.randn(2, 8, 16, dtype=torch.float16), b=torch.randn(3, 16, 24, dtype=torch.float16))
    _raises("M, N and K must be >= 1", a=torch.randn(0, 16, dtype=torch.float16))
    _raises("config must be a gnn_policy.TileConfig", TypeError, config={"BLOCK_M": 64})
    _raises("no backward pass", a=torch.randn(8, 16, dtype=torch.float16, requires_grad=True))
    _raises("interpreter computes bf16 products wrongly", a=torch.randn(8, 16, dtype=torch.bfloat16),
            b=torch.randn(16, 24, dtype=torch.bfloat16))
    with torch.no_grad():
        matmul(torch.randn(8, 16, requires_grad=True), torch.randn(16, 24))


def test_invalid_config_names_the_rule():
    with pytest.raises(InvalidConfigError, match=r"\[smem\].*232448") as err:
        _raises_config(T(256, 256, 256, 1, 8, 8, 6))
    assert [v.rule for v in err.value.violations][0] == "smem"
    with pytest.raises(InvalidConfigError, match=r"\[split_k\]"):
        _raises_config(T(16, 16, 16, 4, 8, 2, 2))  # K=16 is one tile
    with pytest.raises(InvalidConfigError, match=r"\[tma-alignment\].*row stride of 5 x 2 bytes"):
        matmul(torch.randn(8, 5, dtype=torch.float16), torch.randn(5, 16, dtype=torch.float16),
               config=T(16, 16, 16, variant="tma"))


def _raises_config(config):
    matmul(torch.randn(8, 16, dtype=torch.float16), torch.randn(16, 24, dtype=torch.float16), config=config)


def test_cpu_tensors_without_the_interpreter_are_refused():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import torch, gnn_policy; gnn_policy.matmul(torch.ones(2, 2), torch.ones(2, 2))"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "set TRITON_INTERPRET=1" in res.stderr
