"""gnn_policy.benchmarks.launch_floor: best-known times, the two forms of the bound, rows below it."""
import math

import pytest

import hardware_specs
from graphs import GemmProblem
from gnn_policy.benchmarks import launch_floor as lf
from gnn_policy.calibration import roofline_us

H200 = hardware_specs.load("h200")


def _rows() -> list[dict]:
    """Problems of a train family, 0.25 to 20 us of work, timed as if each kernel cost 4 us more."""
    from graphs.suite import split

    family = split("train")[0].model
    out = []
    for m in (1, 64, 256, 1024, 4096, 16384):
        p = GemmProblem(m, 768, 768, model=family)
        work = roofline_us(p, H200, floor=False)
        out += [{"gpu": H200.name, "problem": p, "config": "bm64_bn64_bk64_sk1_gm8_w4_s3_ptr", "us": work + 4.0},
                {"gpu": H200.name, "problem": p, "config": "bm64_bn64_bk64_sk1_gm8_w4_s3_tma", "us": work + 9.0},
                {"gpu": H200.name, "problem": p, "config": "cublas", "us": work + 5.0}]
    return out


def test_bests_keep_the_fastest_triton_and_cublas_apart():
    best = lf.bests(_rows())
    assert len(best) == 6 and all(b.split == "train" for b in best)
    assert all(b.triton_us == pytest.approx(b.work_us + 4.0) and b.cublas_us == pytest.approx(b.work_us + 5.0)
               for b in best)


def test_the_sum_fits_times_that_are_work_plus_a_constant():
    out = lf.forms(lf.bests(_rows()))
    assert out["sum"]["tightest"]["t0_us"] == pytest.approx(4.0, abs=0.01)
    assert out["sum"]["tightest"]["all"]["median_abs_log"] < 0.01
    assert out["max"]["tightest"]["all"]["median_abs_log"] > out["sum"]["tightest"]["all"]["median_abs_log"]
    assert all(v["all"]["below_bound"] == 0 for v in out["sum"].values())


def test_rows_below_the_bound_are_counted_per_form():
    rows = _rows()
    tiny = GemmProblem(2, 56, 105)
    rows.append({"gpu": H200.name, "problem": tiny, "config": "bm16_bn16_bk128_sk1_gm1_w4_s4_ptr", "us": 2.0})
    out = lf.rows_below_bound(rows)
    assert out["triton"] == {"rows": 13, "no_floor": 0, "max": 1, "sum": 1}
    assert out["cublas"] == {"rows": 6, "no_floor": 0, "max": 0, "sum": 0}
    assert math.isclose(lf.bound_us(1.0, 2.5, "sum"), 3.5) and lf.bound_us(1.0, 2.5, "max") == 2.5
