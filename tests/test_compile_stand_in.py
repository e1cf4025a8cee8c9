"""`stand_in`: compile workers compile a small problem in a large one's place, so its kernels
must be exactly the ones the large problem needs. Checked on the CPU by computing Triton's
specialisation (signature, constexprs, attributes) for sm_90 for both, without compiling."""
import itertools

import pytest

from graphs import GemmProblem
from gnn_policy.measure.compile import stand_in
from gnn_policy.space import TileConfig

P, T = GemmProblem, TileConfig
# each beyond a threshold in some dimension, with odd remainders; small enough to allocate here
PROBLEMS = [
    P(600, 520, 9000, dtype="bf16"),
    P(513, 1000, 8200, dtype="fp16", b_layout="col", bias=True, activation="gelu"),
    P(1, 777, 12345, dtype="bf16", a_layout="col", residual=True),
    P(700, 48, 8192, batch=3, dtype="fp16", activation="silu", residual=True),
    P(40, 530, 300, batch=37, dtype="bf16", b_layout="col", bias=True),
    P(1000, 1000, 16, batch=33, dtype="fp32", a_layout="col", b_layout="col"),
    P(520, 640, 700, batch=48, dtype="bf16", residual=True),
]
CONFIGS = [T(64, 64, 64, 1, 8, 4, 3, "ptr"), T(128, 64, 32, 4, 8, 4, 3, "ptr"), T(16, 32, 256, 16, 8, 4, 4, "ptr"),
           T(64, 128, 64, 1, 8, 4, 3, "tma"), T(32, 64, 128, 8, 4, 4, 3, "tma"),
           T(128, 128, 64, 1, 8, 8, 3, "persistent"), T(64, 64, 32, 2, 8, 4, 3, "persistent"),
           T(256, 64, 32, 1, 8, 8, 3, "tma"), T(256, 32, 64, 1, 4, 8, 2, "persistent"),
           T(128, 256, 64, 1, 8, 8, 4, "subtile"), T(64, 32, 64, 2, 8, 4, 3, "subtile"),
           T(128, 128, 64, 1, 8, 4, 4, "streamk"), T(64, 16, 128, 1, 1, 4, 3, "streamk")]


def _specialisation(problem, config):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from gnn_policy.kernels.launch import LayoutError, prepare
    from gnn_policy.measure.inputs import make_inputs

    args = make_inputs(problem, "cpu", fill=False)
    try:
        kernel, _, _, kargs, meta = prepare(args["a"], args["b"], config, args["bias"], args["activation"],
                                            args["residual"], None, compile_only=True)
    except LayoutError as exc:
        return "invalid", str(exc.violation.rule)
    if not hasattr(kernel, "signature"):  # under TRITON_INTERPRET=1: the JIT function it wraps
        kernel = JITFunction(kernel.fn, **{k: v for k, v in kernel.kwargs.items() if v is not None})
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*kargs, **meta)
    _, signature, constexprs, attrs = kernel._pack_args(backend, meta, bound, specialization, options)
    return kernel.fn.__name__, signature, constexprs, attrs


def test_stand_in_is_small_and_keeps_what_compiling_reads():
    for p in PROBLEMS:
        s = stand_in(p)
        assert (s.m % 256, s.n % 256, s.k % 256, s.batch % 16) == (p.m % 256, p.n % 256, p.k % 256, p.batch % 16)
        assert (s.m == 1, s.n == 1, s.k == 1, s.batch == 1) == (p.m == 1, p.n == 1, p.k == 1, p.batch == 1)
        assert max(s.m, s.n, s.k) <= 511 and s.batch <= 31
        assert (s.dtype, s.a_layout, s.b_layout, s.bias, s.activation, s.residual) == \
            (p.dtype, p.a_layout, p.b_layout, p.bias, p.activation, p.residual)
    small = P(100, 300, 500, batch=5)
    assert stand_in(small) == small


@pytest.mark.parametrize("problem,config", list(itertools.product(PROBLEMS, CONFIGS)),
                         ids=[f"{p.key}-{c.key}" for p, c in itertools.product(PROBLEMS, CONFIGS)])
def test_stand_in_needs_the_same_kernel(problem, config):
    assert stand_in(problem) != problem
    assert _specialisation(stand_in(problem), config) == _specialisation(problem, config)
