"""Pure parts of the measurement harness (the GPU parts run in test_kernel_gpu.py)."""
import torch

from gnn_policy.kernels.reference import reference, relative_error
from gnn_policy.measure.timing import Timing, rotation_count


def test_rotation_streams_twice_the_l2():
    l2 = 60 * 2**20
    assert rotation_count(1, l2) == 64              # capped
    assert rotation_count(400 * 2**20, l2) == 1     # one set already exceeds 2x L2
    n = rotation_count(8 * 2**20, l2)
    assert n * 8 * 2**20 >= 2 * l2 > (n - 1) * 8 * 2**20


def test_timing_figures():
    t = Timing(median_ms=2.0, p10_ms=1.9, p90_ms=2.1, replays=20, calls_per_replay=4)
    assert abs(t.spread - 0.1) < 1e-12
    assert abs(t.tflops(4e12) - 2000.0) < 1e-9


def test_relative_error_is_inf_on_a_nan_where_the_reference_is_finite():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ref = reference(a, b)
    assert relative_error(a @ b, ref) < 1e-6
    poisoned = (a @ b).clone()
    poisoned[3, 4] = float("nan")
    assert relative_error(poisoned, ref) == float("inf")


def test_reference_epilogue_order():
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    bias, res = torch.randn(5), torch.randn(4, 5)
    expected = torch.relu(a.double() @ b.double() + bias.double()) + res.double()
    assert torch.allclose(reference(a, b, bias=bias, activation="relu", residual=res), expected)
