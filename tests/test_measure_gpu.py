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
    half = Bench(problem, l2, stream=slice_stream(64))  # a multiple of 8: Hopper's slice granularity
    assert half.check(config).ok
    ratio = half.time(config).median_ms / full.time(config).median_ms
    assert 1.65 < ratio < 2.5, ratio  # 132 / 64 SMs on a compute-bound GEMM


def test_a_slice_stream_reaches_exactly_its_sms_or_is_refused():
    from gnn_policy.measure.slices import SliceError, slice_stream, sms_reached

    assert sms_reached(torch.cuda.Stream()) == hardware_specs.detect().sm_count
    assert sms_reached(slice_stream(16)) == 16
    try:
        stream = slice_stream(66)  # not a multiple of 8: the driver may round it up
    except SliceError as exc:
        assert "runs kernels on" in str(exc)
    else:
        assert sms_reached(stream) == 66


def test_a_faulting_and_a_hanging_kernel_become_rows_and_the_run_goes_on():
    gpu = hardware_specs.detect().name
    problem = GemmProblem(256, 512, 512, dtype="fp16")
    configs = [TileConfig(64, 64, 64, 1, 8, 4, 3, "ptr"), TileConfig(32, 64, 64, 1, 8, 4, 3, "ptr"),
               TileConfig(16, 64, 64, 1, 8, 4, 3, "ptr"), TileConfig(128, 64, 64, 1, 8, 4, 3, "ptr"), None]
    with WorkerPool("faulty_runner:measure", gpu=gpu, timeout_s=20) as pool:
        rows = list(pool.run(problem, configs))
        assert pool.restarts == 2
    assert [r.status for r in rows] == ["ok", "crashed", "ok", "timeout", "ok"], rows
    assert "illegal" in rows[1].error.lower() or "exited" in rows[1].error, rows[1].error
    assert rows[2].max_rel_err < 1e-2 and rows[4].config == "cublas"


def test_a_compile_past_its_timeout_is_a_timeout_result(tmp_path, monkeypatch):
    from gnn_policy.measure.compile import compile_one

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a cached kernel would load at once
    problem = GemmProblem(4096, 4096, 4096, dtype="bf16", bias=True, activation="silu")
    slow = compile_one((problem, TileConfig(256, 128, 64, 2, 16, 8, 4, "tma"), 0.05))
    assert slow.status == "timeout" and "0.05 s" in slow.error
    ok = compile_one((problem, TileConfig(128, 128, 64, 1, 8, 4, 3, "tma"), 300.0))
    assert ok.status == "ok", ok.error


def test_a_config_far_behind_the_best_is_timed_from_one_replay():
    gpu = hardware_specs.detect().name
    problem = GemmProblem(2048, 2048, 2048, dtype="bf16")
    fast, slow = TileConfig(128, 256, 64, 1, 8, 8, 3, "tma"), TileConfig(16, 16, 32, 1, 1, 1, 1, "ptr")
    with WorkerPool("gnn_policy.measure.runner:measure_configs", gpu=gpu, timeout_s=300) as pool:
        first_slow, _, then_slow = pool.run(problem, [slow, fast, slow])
    assert first_slow.p10_ms < first_slow.p90_ms  # measured first: full precision
    assert then_slow.p10_ms == then_slow.median_ms == then_slow.p90_ms  # screened: one replay
    assert abs(then_slow.median_ms - first_slow.median_ms) / first_slow.median_ms < 0.1
