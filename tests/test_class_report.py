"""The class report on a small hand-made database: wins, fractions of best known, cuBLAS."""
import math

import hardware_specs
from graphs import GemmProblem
from graphs.classes import classes
from graphs.random_gemms import problems
from gnn_policy.baselines import ANALYTIC, analytic_pick, default_pick, fits
from gnn_policy.benchmarks.class_report import class_table, main, records
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.measure.simulator import load_fitted
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
from gnn_policy.space import NAMED_LISTS, TileConfig, space

H200 = hardware_specs.load("h200")
GPU = H200.name
BEST = TileConfig(16, 16, 16, 1, 1, 2, 1, "ptr")  # in no named list, never a default or analytic pick here


def _row(p, config, tflops, status="ok"):
    key = config.key if config else "cublas"
    return Measurement(GPU, p.key, key, status, median_ms=1.0 if status == "ok" else None,
                       tflops=tflops if status == "ok" else None), p, config


def _database(path, model):
    first, second = problems("random-test", 2)
    tutorial = NAMED_LISTS["triton_tutorial"][0]
    rows = []
    for p, default_status in ((first, "ok"), (second, "compile_error")):
        rows += [_row(p, BEST, 100.0), _row(p, None, 200.0), _row(p, tutorial, 25.0),
                 _row(p, analytic_pick(p, H200, space("full"), model), 80.0),
                 _row(p, default_pick(p, H200, fits(space("full"), H200, p)), 50.0, default_status)]
    suite_problem = GemmProblem(16, 4096, 4096, model="Qwen2-7B")  # split "test": not in the report
    rows.append(_row(suite_problem, BEST, 1.0))
    with Database(path) as db:
        db.add(rows)
    return first, second


def test_records_and_the_table_hold_the_fractions(tmp_path):
    model = load_fitted(ANALYTIC)
    first, second = _database(tmp_path / "m.sqlite", model)
    with Database(tmp_path / "m.sqlite") as db:
        recs = records(db, H200, "random-test", model)
    assert [r.problem.key for r in recs] == [first.key, second.key] and all(r.best == BEST for r in recs)
    assert recs[0].fractions == {"default_config": 0.5, "analytic": 0.8, "triton_tutorial": 0.25, "inductor_mm": None}
    assert recs[1].fractions["default_config"] is None  # a failed pick is left out, not scored
    assert all(math.isclose(r.best_over_cublas, 0.5) for r in recs)
    table = class_table(recs)
    all_row = next(line for line in table.splitlines() if line.startswith("| all "))
    assert all_row == "| all | 2 | 100% | 0% | 0% | 0% | 0% | 0% | 0% | 0.50 (1/2) | 0.80 | 0.25 | - | 0.50 |"  # ptr, tma, persistent, warpspec, subtile, streamk, split-K
    for cls in set(classes(first)) | set(classes(second)):
        assert f"| {cls} |" in table


def test_the_command_prints_the_report(tmp_path, capsys):
    _database(tmp_path / "m.sqlite", load_fitted(ANALYTIC))
    main(["--db", str(tmp_path / "m.sqlite"), "--split", "random-test", "--analytic", "",
          "--markdown", str(tmp_path / "r.md")])
    out = capsys.readouterr().out
    assert out.startswith("2 problems of random-test on H200-SXM-141GB") and "| analytic / best |" in out
    assert (tmp_path / "r.md").read_text().strip() == out.strip()
    main(["--db", str(tmp_path / "m.sqlite"), "--split", "random-val", "--analytic", ""])
    assert "no measured problems of split random-val" in capsys.readouterr().out


def test_a_policy_is_scored_by_its_first_pick_and_its_best_of_k(tmp_path):
    model = load_fitted(ANALYTIC)
    first, second = _database(tmp_path / "m.sqlite", model)
    policy = Policy.load(DEFAULT_CHECKPOINT)
    picks = [pick.config for pick in policy.top_k(first, H200, 2)]
    with Database(tmp_path / "m.sqlite") as db:
        db.add([_row(first, picks[0], 40.0), _row(first, picks[1], 70.0), _row(second, picks[0], 10.0)])
        recs = records(db, H200, "random-test", model, policies={"p": policy}, k=2)
    assert recs[0].fractions["p"] == 0.4 and recs[0].fractions["p best of 2"] == 0.7
    second_picks = [pick.config for pick in policy.top_k(second, H200, 2)]
    assert recs[1].fractions["p"] == (0.1 if second_picks[0] == picks[0] else None)
    assert recs[1].fractions["p best of 2"] is None  # a pick without a timing: no best of k
    assert "| p / best | p best of 2 / best |" in class_table(recs)
