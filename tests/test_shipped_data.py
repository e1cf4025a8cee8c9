"""The shipped H200 snapshot (data/measurements): it loads on a CPU-only machine and is sane."""
from collections import defaultdict
from pathlib import Path

import pytest

import hardware_specs
from graphs import random_gemms
from graphs.random_gemms import SPLITS as RANDOM_SPLITS
from graphs.suite import SPLITS, split
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig, fits_k, violations

SHARDS = Path(__file__).resolve().parent.parent / "data" / "measurements"
H200 = hardware_specs.load("h200")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    with Database(tmp_path_factory.mktemp("shipped") / "m.sqlite") as db:
        assert load_shipped(db, SHARDS) > 10_000
        return list(db.rows_after(0))


def test_every_row_is_a_real_row_of_the_h200_or_h100_or_a_slice_of_one_on_a_suite_or_random_problem(rows):
    # a random split's problems are its generator's first ones (seed 0): collect and sweep take them in order
    drawn = {p.key for s in SPLITS for p in split(s)} | {p.key for s in RANDOM_SPLITS for p in random_gemms.problems(s, 3000)}
    assert H200.name in {r["gpu"] for r in rows} and {r["source"] for r in rows} == {"real"}
    gpus = {hardware_specs.load(g) for g in {r["gpu"] for r in rows}}
    assert {g.slice_of or g.name for g in gpus} == {H200.name, hardware_specs.load("h100").name}
    assert {r["problem"] for r in rows} <= drawn
    assert all("triton 3.6.0" in r["versions"] for r in rows)


def test_correct_rows_are_checked_plausible_and_valid(rows):
    peak = H200.peak("bf16")
    for r in rows:
        if r["status"] != "ok":
            continue
        assert 0 < r["tflops"] < peak and r["p10_ms"] <= r["median_ms"] <= r["p90_ms"], r
        if r["config"] == CUBLAS:
            continue
        assert r["max_rel_err"] <= 1e-2, r
        config, f = TileConfig.from_key(r["config"]), r["problem_fields"]
        assert not violations(config, H200, f["dtype"]) and fits_k(config, f["k"]), r


def test_every_h200_problem_has_cublas_and_a_sample_of_configs(rows):
    configs = defaultdict(set)
    for r in rows:
        if r["gpu"] == H200.name:
            configs[r["problem"]].add(r["config"])
    assert all(CUBLAS in cs for cs in configs.values())
    complete = [cs for cs in configs.values() if len(cs) >= 200]
    assert len(complete) >= 0.8 * len(configs)


def test_the_evaluation_problems_are_swept_densely(rows):
    from gnn_policy.collect import select_problems

    correct = defaultdict(set)
    for r in rows:
        if r["gpu"] == H200.name and r["status"] == "ok" and r["config"] != CUBLAS:
            correct[r["problem"]].add(r["config"])
    assert all(len(correct[p.key]) >= 1500 for p in select_problems("test", 40, 0))


def test_offline_picks_of_the_shipped_policy_are_fractions_of_best_known(tmp_path):
    from gnn_policy.benchmarks.offline_picks import evaluate
    from gnn_policy.policy import Policy

    with Database(tmp_path / "m.sqlite") as db:
        load_shipped(db, SHARDS)
        out = evaluate(db, Policy.load(), H200, "test", global_picks=True, sweep_rule=True)
        measured = sum(p.model in SPLITS["test"] for p in db.problems(H200.name))
    assert out["problems"] == measured >= 40 and out["global_picks"]["picks"] == 8 * measured
    for top1, best8 in (("policy_top1", "policy_best_of_8"), ("rule_top1", "rule_best_of_8")):
        assert 0 < out[top1] <= out[best8] <= 1
    by_size = out["rule_top1_by_size"]  # two partitions of the same problems
    assert by_size["GFLOP <= 100"]["problems"] + by_size["GFLOP > 100"]["problems"] == measured
    assert by_size["M <= 64"]["problems"] + by_size["M > 64"]["problems"] == measured
    assert all(0 < g["top1"] <= 1 for g in by_size.values())
    assert out["rule_sweep_top1"]["rerank=16"]["cost_weight=10"] == out["rule_top1"]  # the shipped rule's cell
    # cost_model 1 ranks by predicted TFLOP/s, so the old rule's constants cannot move its first pick
    assert Policy.load().model.cfg.cost_model == 1
    assert {v for row in out["rule_sweep_top1"].values() for v in row.values()} == {out["policy_top1"]}


def test_no_correct_row_beats_the_roofline_with_the_launch_floor(rows):
    """The bound of `calibration.roofline_us` is physics: no measured kernel was faster."""
    from gnn_policy.calibration import roofline_us
    from gnn_policy.db_schema import problem_from_fields

    specs = {}
    for r in rows:
        if r["status"] == "ok":
            gpu = specs.setdefault(r["gpu"], hardware_specs.load(r["gpu"]))
            assert r["median_ms"] * 1e3 >= roofline_us(problem_from_fields(r["problem_fields"]), gpu), r
