"""GPU-only: the real runner inside the restartable worker, and the timing method."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import hardware_specs  # noqa: E402
from graphs import GemmProblem  # noqa: E402
from gnn_policy.measure.runner import Bench  # noqa: E402
from gnn_policy.measure.workers import WorkerPool  # noqa: E402
from gnn_policy.space import TileConfig  # noqa: E402


def test_real_runner_in_a_worker_measures_configs_and_cublas():
    gpu = hardware_specs.detect().name
    problem = GemmProblem(128, 4096, 4096, dtype="bf16", bias=True, activation="gelu")
    configs = [TileConfig(64, 64, 128, 1, 8, 4, 5, "tma"), TileConfig(16, 64, 64, 4, 16, 2, 5, "ptr"), None]
    with WorkerPool("gnn_policy.measure.runner:measure_configs", gpu=gpu, timeout_s=300) as pool:
        rows = list(pool.run(problem, configs))
    assert [r.status for r in rows] == ["ok", "ok", "ok"], rows
    assert rows[2].config == "cublas" and all(r.tflops > 10 for r in rows)
    assert all(r.max_rel_err < 1e-2 for r in rows[:2]) and "triton" in rows[0].versions


def test_graph_timing_is_repeatable_and_slower_for_more_work():
    l2 = hardware_specs.detect().l2_bytes
    small = Bench(GemmProblem(2048, 2048, 2048, dtype="bf16"), l2)
    big = Bench(GemmProblem(4096, 4096, 4096, dtype="bf16"), l2)
    config = TileConfig(128, 256, 64, 1, 8, 8, 3, "tma")
    a, b = small.time(config).median_ms, small.time(config).median_ms
    assert abs(a - b) / a < 0.1
    assert big.time(config).median_ms > 4 * a


def test_an_sm_slice_is_correct_and_slower_in_proportion():
    from gnn_policy.measure.slices import slice_stream

    l2 = hardware_specs.detect().l2_bytes
    problem = GemmProblem(4096, 4096, 4096, dtype="bf16")
    config = TileConfig(128, 256, 64, 1, 8, 8, 3, "tma")
    full = Bench(problem, l2)
    half = Bench(problem, l2, stream=slice_stream(66))
    assert half.check(config).ok
    ratio = half.time(config).median_ms / full.time(config).median_ms
    assert 1.6 < ratio < 2.4, ratio  # 132 / 66 SMs on a compute-bound GEMM
