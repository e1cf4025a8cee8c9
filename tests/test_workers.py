"""The restartable measuring worker, with a fake runner that crashes and hangs on purpose."""
from graphs import GemmProblem
import pytest

from gnn_policy.measure.workers import ProblemSetupError, WorkerPool
from gnn_policy.space import TileConfig

P = GemmProblem(64, 64, 64)
CONFIGS = [TileConfig(bm, 64, 32) for bm in (16, 32, 64, 128, 256)]


def test_every_config_gets_a_row_in_order_through_crashes_and_hangs(tmp_path):
    calls = tmp_path / "calls.txt"
    with WorkerPool("fake_runner:measure", gpu="H200-SXM-141GB", timeout_s=2.0,
                    crash_on=(32,), hang_on=(128,), calls_file=str(calls)) as pool:
        rows = list(pool.run(P, CONFIGS))
        assert pool.restarts == 2
        again = list(pool.run(P, CONFIGS[:1]))  # the restarted worker keeps serving
    assert [r.config for r in rows] == [c.key for c in CONFIGS]
    assert [r.status for r in rows] == ["ok", "crashed", "ok", "timeout", "ok"]
    assert "exited (code 3)" in rows[1].error and "within 2 s" in rows[3].error
    assert again[0].status == "ok"
    # nothing was measured twice: the configs after a failure go to the fresh worker
    assert calls.read_text().split() == [c.key for c in CONFIGS] + [CONFIGS[0].key]


def test_a_reported_crash_restarts_the_worker_without_losing_the_rest(tmp_path):
    calls = tmp_path / "calls.txt"
    with WorkerPool("fake_runner:measure", gpu="H200-SXM-141GB", timeout_s=5.0,
                    report_crash_on=(64,), calls_file=str(calls)) as pool:
        rows = list(pool.run(P, CONFIGS + [None]))
        assert pool.restarts == 1
    assert [r.status for r in rows][:5] == ["ok", "ok", "crashed", "ok", "ok"]
    assert rows[2].error.startswith("CUDA error") and rows[5].config == "cublas"
    assert calls.read_text().split() == [c.key for c in CONFIGS] + ["cublas"]


def test_a_problem_that_cannot_be_set_up_blames_no_config():
    with WorkerPool("fake_runner:measure", gpu="H200-SXM-141GB", timeout_s=5.0, setup_fails_for=(64,)) as pool:
        with pytest.raises(ProblemSetupError, match="no room for problem 1x64x64x64"):
            list(pool.run(P, CONFIGS))
        rows = list(pool.run(GemmProblem(32, 64, 64), CONFIGS[:2]))  # a fresh worker serves the next
    assert [r.status for r in rows] == ["ok", "ok"]


def test_a_compiler_that_aborts_loses_one_job_not_the_stream():
    from graphs import GemmProblem
    from gnn_policy.measure.compile import CompilePool
    from gnn_policy.space import TileConfig
    from tests.aborting_compile import compile_or_abort

    problem = GemmProblem(64, 64, 64)
    configs = [TileConfig(bm, 32, 32) for bm in (32, 16, 64, 128, 16, 32)]
    with CompilePool(workers=2, timeout_s=60.0, fn=compile_or_abort) as pool:
        results = list(pool.stream((problem, c) for c in configs))
    assert [r.config for r in results] == [c.key for c in configs]
    assert [r.status for r in results] == ["ok", "compile_error", "ok", "ok", "compile_error", "ok"]
    assert "died" in results[1].error
