"""gnn_policy.calibration: the roofline, the fit, the cap, and the file beside a checkpoint."""
import json
import math

import pytest

import hardware_specs
from graphs import GemmProblem
from gnn_policy import calibration as cal
from gnn_policy.benchmarks.calibrate import report
from gnn_policy.calibration_level import SHAPE_FIELDS, fit_ceiling, fit_level, shape_features

H200 = hardware_specs.load("h200")


def test_roofline_is_compute_or_bandwidth_bound_plus_the_launch_floor():
    big = GemmProblem(8192, 8192, 8192)
    assert cal.roofline_tflops(big, H200, floor=False) == pytest.approx(H200.peak("bf16"))
    assert cal.roofline_us(big, H200) == pytest.approx(big.flops / H200.peak("bf16") / 1e6 + 2.5)
    thin = GemmProblem(1, 4096, 4096)  # reads the 32 MiB weight for 2 x 4096 x 4096 FLOPs
    work_us = thin.bytes_min() / 4.8e12 * 1e6
    assert cal.roofline_tflops(thin, H200, floor=False) == pytest.approx(thin.flops / work_us / 1e6)
    assert cal.roofline_tflops(thin, H200) == pytest.approx(thin.flops / (work_us + 2.5) / 1e6)


def test_a_tiny_problem_takes_at_least_the_launch_floor():
    """1x2x56x105: 0.003 us of work, measured at 2.54 us at best on the H200."""
    tiny = GemmProblem(2, 56, 105, b_layout="col", residual=True)
    assert cal.roofline_us(tiny, H200, floor=False) < 0.01
    assert cal.roofline_us(tiny, H200) >= H200.launch_floor_us == 2.5
    for gpu in map(hardware_specs.load, ("a100-sxm4-80gb", "h200-sm64")):  # a default floor, a slice's
        assert cal.roofline_us(tiny, gpu) >= gpu.launch_floor_us > 0


def test_fit_recovers_a_line_and_apply_never_passes_the_bound():
    roofs = [100.0, 200.0, 50.0, 400.0]
    predicted = [300.0, 150.0, 20.0, 900.0]
    measured = [r * math.exp(-1.0 + 0.5 * math.log(p / r)) for p, r in zip(predicted, roofs)]
    intercept, slope = cal.fit(predicted, measured, roofs)
    assert (intercept, slope) == (pytest.approx(-1.0), pytest.approx(0.5))
    c = cal.Calibration("X", intercept=2.0, slope=1.0)
    assert c.apply(1e6, 100.0, 100.0) == 100.0 and c.apply(1.0, 100.0, 100.0) == pytest.approx(math.e ** 2)
    assert c.apply(1.0, 100.0, 5.0) == 5.0  # the floor's bound caps the line
    with pytest.raises(ValueError, match="two distinct"):
        cal.fit([1.0, 1.0], [1.0, 2.0], [2.0, 2.0])


def test_no_calibrated_figure_exceeds_the_bound():
    fits = {H200.name: cal.Calibration(H200.name, intercept=3.0, slope=1.5)}  # a line far above physics
    for problem in (GemmProblem(2, 56, 105), GemmProblem(16, 4096, 4096), GemmProblem(8192, 8192, 8192)):
        bound = cal.roofline_tflops(problem, H200)
        for predicted in (1e-3, 1.0, 100.0, 1e4):
            for calibrations in (fits, {}):
                figure, _ = cal.calibrated(predicted, problem, H200, calibrations)
                assert 0 < figure <= bound


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


def _row(split, predicted, measured, gpu="X", features=(0.0,), roof=100.0, bound=90.0):
    return {"gpu": gpu, "split": split, "predicted": predicted, "measured": measured, "roof": roof, "bound": bound,
            "features": list(features), "dtype": "bf16"}


def test_report_fits_on_train_and_checks_on_the_rest():
    rows = [_row(s, 4 * m, m) for s, m in [("train", 10.0), ("random-train", 40.0), ("val", 20.0), ("test", 5.0)]]
    rows.append(_row("random-test", 8.0, 1.0, bound=0.5))
    out = report(rows)["gpus"]["X"]
    assert out["slope"] == pytest.approx(1.0) and out["intercept"] == pytest.approx(-math.log(4), abs=1e-4)
    # held out: val, test and random-test; the random-test row is capped at its bound, off by 2x
    assert out["held_out"]["calibrated"] == {"median_abs_log_error": 0.0, "within_20pct": pytest.approx(2 / 3, abs=1e-3),
                                             "rows": 3}
    assert out["held_out"]["raw"]["within_20pct"] == 0.0
    assert set(out["by_split"]) == {"val", "test", "random-test"}  # held out: never a training split
    assert out["by_split"]["random-test"]["calibrated"]["median_abs_log_error"] == pytest.approx(math.log(2), abs=1e-3)
    assert out["by_split"]["random-test"]["measured_above_bound"] == 1 and out["by_split"]["val"]["measured_above_bound"] == 0


def test_a_gpu_measured_on_random_shapes_alone_is_fitted_and_checked():
    rows = [_row(s, 2 * m, m) for s, m in [("random-train", 10.0), ("random-train", 30.0), ("random-val", 20.0)]]
    out = report(rows)["gpus"]["X"]
    assert out["slope"] == pytest.approx(1.0) and out["held_out"]["calibrated"]["rows"] == 1
    assert set(out["by_split"]) == {"random-val"}
    with pytest.raises(SystemExit, match="held-out split"):
        report([r for r in rows if r["split"] == "random-train"])
    with pytest.raises(SystemExit, match="training role.*on Y"):  # every GPU needs its own training rows
        report(rows + [_row("val", 2.0, 1.0, gpu="Y")])


def _planted(gpu: str, intercept: float, slope: float, n: int = 40):
    """Rows whose measured TFLOP/s follow a line per GPU plus a level 0.7 x f0 - 0.3 x f1."""
    rows = []
    for i in range(n):
        f = [math.sin(i), (i % 5) - 2.0]
        predicted, roof = 5.0 + 3 * i, 400.0
        line = intercept + slope * math.log(predicted / roof) + 0.7 * f[0] - 0.3 * f[1]
        rows.append(_row("train", predicted, roof * math.exp(line), gpu=gpu, features=f, roof=roof, bound=roof))
    return rows


def test_the_level_fit_recovers_a_line_per_gpu_and_one_shared_level():
    rows = _planted("A", -1.0, 0.8) + _planted("B", -0.5, 1.1)
    lines, level = fit_level(rows, ridge=0.0)
    assert lines["A"] == (pytest.approx(-1.0), pytest.approx(0.8)) and lines["B"] == (pytest.approx(-0.5), pytest.approx(1.1))
    assert level == (pytest.approx(0.7), pytest.approx(-0.3))
    cal_a = cal.Calibration("A", *lines["A"], level)
    assert all(cal_a.apply(r["predicted"], r["roof"], r["bound"], r["features"]) == pytest.approx(r["measured"])
               for r in rows if r["gpu"] == "A")
    _, shrunk = fit_level(rows, ridge=1e4)  # the ridge shrinks the level, never the lines
    assert all(abs(s) < abs(w) for s, w in zip(shrunk, level))
    with pytest.raises(ValueError, match="one length"):
        fit_level(rows + [_row("train", 1.0, 1.0, gpu="A", features=(1.0, 2.0, 3.0))])
    with pytest.raises(ValueError, match="two distinct"):
        fit_level([_row("train", 2.0, 1.0, gpu="A", features=(1.0,)), _row("train", 2.0, 3.0, gpu="A", features=(2.0,))])


def test_the_ceiling_fit_recovers_a_planted_ceiling_and_no_figure_passes_it():
    """Rows whose line runs into 0.8 of the roofline through the smooth minimum: the fit finds
    that ceiling, and its calibration follows the rows below it and never shows more."""
    rows = []
    for gpu, ceiling in (("A", 0.8), ("B", 0.9)):
        for i in range(60):
            f = [math.sin(i), (i % 5) - 2.0]
            predicted, roof = 2.0 + 8 * i, 400.0
            line = -0.2 + 1.0 * math.log(predicted / roof) + 0.3 * f[0] - 0.1 * f[1]
            measured = roof * math.exp(cal.softmin(line, math.log(ceiling), 8.0))
            rows.append(_row("train", predicted, measured, gpu=gpu, features=f, roof=roof, bound=roof))
    fitted, level, sharpness = fit_ceiling(rows, ridge=0.0)
    assert fitted["A"][2] == pytest.approx(0.8, abs=0.01) and fitted["B"][2] == pytest.approx(0.9, abs=0.01)
    assert sharpness == pytest.approx(8.0, rel=0.1) and level == (pytest.approx(0.3, abs=0.01), pytest.approx(-0.1, abs=0.01))
    intercept, slope, ceiling = fitted["A"]
    fit_a = cal.Calibration("A", intercept, slope, level, ceiling, sharpness)
    assert all(fit_a.apply(r["predicted"], r["roof"], r["bound"], r["features"]) == pytest.approx(r["measured"], rel=0.02)
               for r in rows if r["gpu"] == "A")
    assert fit_a.apply(1e6, 400.0, 500.0, [5.0, -5.0]) <= 0.8 * 400.0 * 1.01  # a huge prediction stops at the ceiling
    assert cal.Calibration("A", 0.0, 1.0).apply(1e6, 400.0, 500.0) == 400.0  # no ceiling: the roofline, as before
    with pytest.raises(ValueError, match="ceiling 1.2 must be in"):
        cal.Calibration("A", 0.0, 1.0, ceiling=1.2)


def test_a_fit_with_a_level_reads_its_features_and_stays_under_the_bound(tmp_path):
    ckpt, p = tmp_path / "p.pt", GemmProblem(16, 4096, 4096)
    cal.path_for(ckpt).write_text(json.dumps({"level": {"weights": [2.0, -1.0]},
                                              "gpus": {H200.name: {"intercept": -1.0, "slope": 1.0}}}))
    fits = cal.load(ckpt)
    assert fits[H200.name].level == (2.0, -1.0)
    roof = cal.roofline_tflops(p, H200, floor=False)
    figure, fitted = cal.calibrated(10.0, p, H200, fits, [0.5, 1.0])  # level 0: the line alone
    assert fitted and figure == pytest.approx(10.0 / math.e)
    figure, _ = cal.calibrated(10.0, p, H200, fits, [1.0, 0.0])  # level +2
    assert figure == pytest.approx(min(cal.roofline_tflops(p, H200), roof, 10.0 * math.e))
    for features in ([50.0, 0.0], [-50.0, 3.0]):
        assert 0 < cal.calibrated(10.0, p, H200, fits, features)[0] <= cal.roofline_tflops(p, H200)
    with pytest.raises(ValueError, match="reads 2 level features, got 0"):
        cal.calibrated(10.0, p, H200, fits)


def test_shape_features_see_alignment_and_layout():
    odd, aligned = GemmProblem(4736, 465, 3072), GemmProblem(4736, 512, 3072, b_layout="col")
    f_odd, f_aligned = (dict(zip(SHAPE_FIELDS, shape_features(q, H200))) for q in (odd, aligned))
    assert len(shape_features(odd, H200)) == len(SHAPE_FIELDS)
    assert f_odd["b_lead_mod8"] == 0.0 and f_aligned["b_lead_mod8"] == 1.0  # B row-major: N is its leading dim
    assert f_odd["b_col"] == 0.0 and f_aligned["b_col"] == 1.0
    assert f_odd["log_n"] == pytest.approx(math.log(465))


class _Policy:
    """Stands in for a Policy: a fixed context, and a count of the times it was asked."""

    def __init__(self, context):
        self.asked, self._context = 0, context

    def context(self, problem, gpu):
        self.asked += 1
        return self._context


def test_displayed_figures_read_the_policy_context_only_where_the_fit_has_a_level():
    from gnn_policy.calibration_level import displayed

    p = GemmProblem(4736, 465, 3072)
    roof, bound = cal.roofline_tflops(p, H200, floor=False), cal.roofline_tflops(p, H200)
    policy = _Policy([1.0, -2.0])
    weights = tuple([0.0] * len(SHAPE_FIELDS) + [0.5, 0.25])  # level 0.5 x 1 + 0.25 x -2 = 0 ...
    fits = {H200.name: cal.Calibration(H200.name, -1.0, 1.0, weights)}
    assert displayed([10.0], p, H200, fits, policy)[0] == (pytest.approx(10.0 / math.e), True) and policy.asked == 1
    policy = _Policy([3.0, 0.0])  # ... and here 1.5
    assert displayed([10.0], p, H200, fits, policy)[0][0] == pytest.approx(min(bound, roof, 10.0 * math.exp(0.5)))
    line_only = {H200.name: cal.Calibration(H200.name, -1.0, 1.0)}
    assert displayed([10.0], p, H200, line_only, policy)[0][0] == pytest.approx(10.0 / math.e) and policy.asked == 1
    assert displayed([1e9], p, H200, {}, policy)[0] == (pytest.approx(bound), False) and policy.asked == 1


def test_the_policy_context_is_its_encoding_and_is_cached_with_the_scores(ckpt):
    import dataclasses

    import torch

    from gnn_policy.model import PolicyModel
    from gnn_policy.policy import Policy

    p = GemmProblem(64, 4096, 4096)
    first = Policy.load(ckpt)  # the first checkpoints' model (cost_model 0): no scores to cache
    torch.manual_seed(0)
    bounded = Policy(PolicyModel(dataclasses.replace(first.model.cfg, cost_model=1)))
    for policy in (first, bounded):
        h, _ = policy.encode(p, H200)
        assert policy.context(p, H200) == pytest.approx(h[0].tolist(), abs=1e-6)
    assert bounded.scores(p, H200).context is bounded.scores(p, H200).context


def test_a_fit_applies_to_its_own_dtypes_and_fp32_is_bounded_by_what_torch_runs():
    import torch

    fits = {H200.name: cal.Calibration(H200.name, -1.0, 1.0, dtypes=("bf16", "fp16"))}
    p16, p32 = GemmProblem(4096, 4096, 4096, dtype="fp16"), GemmProblem(4096, 4096, 4096, dtype="fp32")
    assert cal.calibrated(100.0, p16, H200, fits) == (pytest.approx(100.0 / math.e), True)
    setting = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: IEEE fp32
        assert cal.calibrated(400.0, p32, H200, fits) == (pytest.approx(cal.roofline_tflops(p32, H200, tf32=False)), False)
        assert cal.bound_tflops(p32, H200) < 1.01 * H200.peak("fp32")
        torch.backends.cuda.matmul.allow_tf32 = True
        assert cal.calibrated(400.0, p32, H200, fits) == (400.0, False)  # under the TF32 bound, no fit: as predicted
    finally:
        torch.backends.cuda.matmul.allow_tf32 = setting


@pytest.mark.parametrize("sharpness", [1.0, 16.0, 1e4])
def test_softmin_stays_below_both_and_within_log2_over_s(sharpness):
    for line, cap in [(-3.0, -0.2), (-0.2, -0.2), (0.5, -0.2), (1e300, -0.1), (-1e300, -0.1)]:
        got = cal.softmin(line, cap, sharpness)
        assert got <= min(line, cap) and got >= min(line, cap) - math.log(2) / sharpness - 1e-12
    assert cal.softmin(-0.2, -0.2, sharpness) == pytest.approx(-0.2 - math.log(2) / sharpness)
    # no sharpness: the hard minimum with the ceiling, which a stored ceiling still gets
    assert cal.Calibration("A", 0.0, 1.0, ceiling=0.8).apply(1e6, 400.0, 500.0) == pytest.approx(320.0)
    with pytest.raises(ValueError, match="sharpness 0.5 0 or at least 1"):
        cal.Calibration("A", 0.0, 1.0, ceiling=0.8, sharpness=0.5)
