"""Offline evaluation on replayed labels: every picker orders the measured configs of a problem."""
import random

import torch

import hardware_specs
from graphs.suite import split
from gnn_policy.benchmarks.offline_eval import KS, evaluate
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.measure.simulator import load_fitted
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
from gnn_policy.space import NAMED_LISTS, space, violations

GPU = hardware_specs.load("h200")


def test_every_picker_is_scored_against_best_known_per_class(tmp_path):
    rng = random.Random(0)
    valid = [c for c in space("full") if not violations(c, GPU, "bf16")]
    problems = [p for p in split("val") if p.dtype == "bf16" and p.k >= 1024][:3]
    with Database(tmp_path / "m.sqlite") as db:
        for p in problems:
            configs = rng.sample(valid, 20) + list(NAMED_LISTS["triton_tutorial"][:4])
            db.add([(Measurement(GPU.name, p.key, c.key, "ok", median_ms=1.0, tflops=10 + 100 * rng.random()), p, c)
                    for c in configs])
        torch.manual_seed(0)
        model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(GPU.name,), cost_model=1))
        old = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(GPU.name,)))
        analytic = load_fitted(DEFAULT_CHECKPOINT.parent / "analytic.json")
        out = evaluate(db, GPU, "val", {"new": Policy(model)}, Policy(old), analytic, seed=0)
    assert out["problems"] == 3
    fractions = out["fraction_of_best_known"]
    assert {"new", "new_by_score", "new_heads", "old", "analytic", "random"} <= set(fractions)
    for picker in fractions.values():
        for by_k in picker.values():
            figures = [by_k[str(k)] for k in KS]
            assert all(0 < f <= 1 for f in figures) and figures == sorted(figures)  # best of more is never worse
    assert fractions["new"]["all"]["problems"] == 3
    assert out["calibration"]["new"]["max_predicted_over_roofline"] <= 1.0
    assert out["calibration"]["new"]["all_candidates"]["rows"] == 3 * 24
