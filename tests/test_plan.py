"""Launch plans (kernels/plan.py) through the interpreter: a plan's arguments for a new call are
the ones `launch.prepare` builds for it, and running them gives torch's result. Launching
through the compiled kernel needs a GPU (test_kernel_gpu.py)."""
import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from graphs import GemmProblem
from gnn_policy import TileConfig
from gnn_policy.kernels import plan as plans
from gnn_policy.kernels.launch import prepare
from gnn_policy.kernels.matmul import matmul_kernel
from gnn_policy.kernels.reference import TOLERANCE, reference, relative_error
from gnn_policy.measure.inputs import make_inputs
from gnn_policy.ops import INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="CPU kernel tests run under TRITON_INTERPRET=1")

P, T = GemmProblem, TileConfig
CASES = [
    (P(20, 104, 48, dtype="fp16", bias=True, b_layout="col"), T(16, 32, 16, 1, 4, 4, 2, "ptr")),
    (P(33, 40, 200, dtype="fp16", activation="gelu", residual=True), T(16, 32, 32, 4, 8, 4, 2, "ptr")),
    (P(24, 48, 72, batch=3, dtype="fp16", a_layout="col", bias=True), T(16, 16, 32, 2, 8, 2, 2, "tma")),
    (P(64, 64, 192, dtype="fp32", b_layout="col", activation="silu", residual=True), T(32, 64, 64, 3, 1, 4, 3, "tma")),
]


def _same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and \
            (x.data_ptr(), x.shape, x.stride()) == (y.data_ptr(), y.shape, y.stride())
    if isinstance(x, TensorDescriptor):
        fields = lambda d: (list(d.shape), list(d.strides), list(d.block_shape))  # noqa: E731
        return isinstance(y, TensorDescriptor) and _same(x.base, y.base) and fields(x) == fields(y)
    return x == y and type(x) is type(y)


@pytest.mark.parametrize("problem, config", CASES, ids=[c.key for _, c in CASES])
def test_a_plan_binds_what_prepare_builds_and_computes_the_product(problem, config):
    first = make_inputs(problem, "cpu", seed=0)
    act = first.pop("activation")
    c, plan = plans.make_plan(**first, config=config, activation=act)
    assert relative_error(c, reference(**first, activation=act)) < TOLERANCE[c.dtype]
    assert plan is not None and plan.compiled is None  # the interpreter compiles nothing
    assert not any(isinstance(v, (torch.Tensor, TensorDescriptor)) for v in plan.values)  # holds no tensor

    call = make_inputs(problem, "cpu", seed=1)
    call.pop("activation")
    out, values = plan.bind(call["a"], call["b"], call["bias"], call["residual"])
    _, c2, g, args, meta = prepare(**call, config=config, activation=act, out=out)
    want = list(args) + [meta[name] for name in matmul_kernel.arg_names[len(args):]]
    fresh = {plans.WORKSPACE, plans.COUNTERS} if config.split_k > 1 else set()
    assert tuple(g) == plan.grid and len(values) == len(want)
    for i, (got, expected) in enumerate(zip(values, want)):
        if i in fresh:  # allocated per call: only their shapes and dtypes must agree
            assert got.shape == expected.shape and got.dtype == expected.dtype, i
        else:
            assert _same(got, expected), (i, got, expected)
    # the interpreter runs the bound arguments as the compiled launcher would receive them
    n = len(args)
    matmul_kernel[plan.grid](*values[:n], **dict(zip(matmul_kernel.arg_names[n:], values[n:])),
                             num_warps=config.num_warps, num_stages=config.num_stages)
    assert relative_error(out, reference(**call, activation=act)) < TOLERANCE[out.dtype]


def test_a_persistent_variant_has_no_plan():
    problem = P(32, 64, 64, dtype="fp16")
    inputs = make_inputs(problem, "cpu", seed=0)
    inputs.pop("activation")
    c, plan = plans.make_plan(**inputs, config=T(16, 32, 32, 1, 8, 4, 2, "persistent"), activation=None)
    assert plan is None and relative_error(c, reference(**inputs, activation=None)) < TOLERANCE[c.dtype]
