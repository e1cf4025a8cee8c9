"""gnn_policy.calibration: the roofline, the fit, the cap, and the file beside a checkpoint."""
import json
import math

import pytest

import hardware_specs
from graphs import GemmProblem
from gnn_policy import calibration as cal
from gnn_policy.benchmarks.calibrate import report

H200 = hardware_specs.load("h200")


def test_roofline_is_compute_or_bandwidth_bound():
    big = GemmProblem(8192, 8192, 8192)
    assert cal.roofline_tflops(big, H200) == pytest.approx(H200.peak("bf16"))
    thin = GemmProblem(1, 4096, 4096)  # reads the 32 MiB weight for 2 x 4096 x 4096 FLOPs
    assert cal.roofline_tflops(thin, H200) == pytest.approx(thin.flops / (thin.bytes_min() / 4.8e12) / 1e12)


def test_fit_recovers_a_line_and_apply_never_passes_the_roofline():
    roofs = [100.0, 200.0, 50.0, 400.0]
    predicted = [300.0, 150.0, 20.0, 900.0]
    measured = [r * math.exp(-1.0 + 0.5 * math.log(p / r)) for p, r in zip(predicted, roofs)]
    intercept, slope = cal.fit(predicted, measured, roofs)
    assert (intercept, slope) == (pytest.approx(-1.0), pytest.approx(0.5))
    c = cal.Calibration("X", intercept=2.0, slope=1.0)
    assert c.apply(1e6, 100.0) == 100.0 and c.apply(1.0, 100.0) == pytest.approx(math.e ** 2)
    with pytest.raises(ValueError, match="two distinct"):
        cal.fit([1.0, 1.0], [1.0, 2.0], [2.0, 2.0])


def test_calibration_file_beside_the_checkpoint(tmp_path):
    ckpt = tmp_path / "p.pt"
    p = GemmProblem(16, 4096, 4096)
    assert cal.load(ckpt) == {}
    figure, fitted = cal.calibrated(1e6, p, H200, {})
    assert not fitted and figure == pytest.approx(cal.roofline_tflops(p, H200))  # capped, not calibrated
    cal.path_for(ckpt).write_text(json.dumps({"gpus": {H200.name: {"intercept": -1.0, "slope": 1.0}}}))
    loaded = cal.load(ckpt)
    figure, fitted = cal.calibrated(20.0, p, H200, loaded)
    assert fitted and figure == pytest.approx(20.0 / math.e)


def test_report_fits_on_train_and_checks_on_the_rest():
    rows = [{"split": s, "predicted": 4 * m, "measured": m, "roof": 100.0}
            for s, m in [("train", 10.0), ("random-train", 40.0), ("val", 20.0), ("test", 5.0)]]
    rows.append({"split": "random-test", "predicted": 8.0, "measured": 1.0, "roof": 100.0})
    out = report(rows, "X")
    assert out["slope"] == pytest.approx(1.0) and out["intercept"] == pytest.approx(-math.log(4), abs=1e-4)
    assert out["val_and_test"]["calibrated"] == {"median_abs_log_error": 0.0, "within_20pct": 1.0, "rows": 2}
    assert out["val_and_test"]["raw"]["within_20pct"] == 0.0
    assert set(out["by_split"]) == {"val", "test", "random-test"}  # held out: never a training split
    assert out["by_split"]["random-test"]["calibrated"]["median_abs_log_error"] == pytest.approx(math.log(2), abs=1e-3)
