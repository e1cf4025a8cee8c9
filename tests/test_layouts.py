"""Layouts reach the user: tune's layout flags, and matmul asks the policy about the layouts it got."""
import pytest
import torch

from gnn_policy import ops
from gnn_policy.cli import parse
from gnn_policy.kernels.reference import reference, relative_error
from gnn_policy.policy import Pick
from gnn_policy.space import TileConfig
from gnn_policy.tune import layouts


class RecordingPolicy:
    """Answers every problem with one small config and remembers what it was asked."""

    def __init__(self):
        self.asked = []

    def top_k(self, problem, gpu, k):
        self.asked.append(problem)
        return [Pick(TileConfig(16, 16, 16, num_stages=2), 1.0, 1.0)]


@pytest.fixture
def policy(monkeypatch):
    ops.policy_config.cache_clear()
    recording = RecordingPolicy()
    monkeypatch.setattr(ops, "_policy", lambda checkpoint=None: recording)
    yield recording
    ops.policy_config.cache_clear()


def test_matmul_asks_the_policy_about_a_column_major_weight(policy):
    x = torch.randn(12, 40, dtype=torch.float16)
    w = torch.randn(24, 40, dtype=torch.float16)  # nn.Linear's weight [N, K]: w.t() is column-major
    out = ops.matmul(x, w.t())
    assert relative_error(out, reference(x, w.t())) < 1e-2
    ops.matmul(x, w.t().contiguous())
    ops.matmul(w, x.t())  # now A [24, 40] row-major and B column-major again, another shape
    ops.matmul(x.t().contiguous().t(), w.t())  # a column-major A
    seen = [(p.m, p.n, p.k, p.a_layout, p.b_layout) for p in policy.asked]
    assert seen == [(12, 24, 40, "row", "col"), (12, 24, 40, "row", "row"), (24, 12, 40, "row", "col"),
                    (12, 24, 40, "col", "col")]


def test_tune_takes_layouts_and_the_linear_shorthand():
    _, args = parse(["tune", "--m", "16", "--n", "4096", "--k", "4096", "--linear"])
    assert layouts(args) == {"a_layout": "row", "b_layout": "col"}
    _, args = parse(["tune", "--m", "16", "--n", "64", "--k", "64", "--a-layout", "col", "--b-layout", "col"])
    assert layouts(args) == {"a_layout": "col", "b_layout": "col"}
    _, args = parse(["tune", "--m", "16", "--n", "64", "--k", "64"])
    assert layouts(args) == {"a_layout": "row", "b_layout": "row"}
    _, args = parse(["tune", "--m", "16", "--n", "64", "--k", "64", "--linear", "--a-layout", "col"])
    with pytest.raises(ValueError, match="contradicts --a-layout col$"):
        layouts(args)
    # row is B's default, but said next to --linear it contradicts it rather than being ignored
    _, args = parse(["tune", "--m", "16", "--n", "64", "--k", "64", "--linear", "--b-layout", "row"])
    with pytest.raises(ValueError, match="contradicts --b-layout row$"):
        layouts(args)


def test_tune_ranks_the_problem_in_the_layouts_given():
    from gnn_policy.tune import run

    _, args = parse(["tune", "--m", "16", "--n", "4096", "--k", "4096", "--linear", "--top-k", "2"])
    out = run(args)
    assert out["problem"] == "1x16x4096x4096_bf16_rc" and len(out["picks"]) == 2


def test_tune_shows_calibrated_figures_under_the_roofline():
    """(16, 4096, 4096) with bias and GELU: its memory traffic alone (7.0 us) caps it near 77
    TFLOP/s, where the raw cost head once predicted 184; with the launch floor (2.5 us), 57."""
    from gnn_policy.tune import run, table

    _, args = parse(["tune", "--m", "16", "--n", "4096", "--k", "4096", "--bias", "--activation", "gelu"])
    out = run(args)
    assert out["calibrated"] and 55 < out["roofline_tflops"] < 60
    assert all(0 < p["predicted_tflops"] <= out["roofline_tflops"] for p in out["picks"])
    assert f"roofline {out['roofline_tflops']}" in table(out)
