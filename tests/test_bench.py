"""gnn-policy bench with a fake runner: every method spends at most the budget, curves rise with k,
new measurements are stored and shipped, the report and the W&B run are written."""
import csv
import json
import random
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import hardware_specs
from fake_runner import measure as fake_measure
from gnn_policy.collect import CollectArgs, run as collect
from gnn_policy.database import Database
from gnn_policy.measure.compile import CompileResult
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import save_checkpoint
from gnn_policy.search import Measurer, evolutionary_search, random_search, run_searches, valid_configs
from gnn_policy.space import space
from graphs import GemmProblem
from training.bench import BenchArgs, run

H200 = hardware_specs.load("h200")


class _MadeUpLaw:
    """A Measurer stand-in whose TFLOP/s grow with the tile; it records every batch it is asked for."""

    def __init__(self):
        self.calls: list[list] = []

    def many(self, jobs):
        self.calls.append([(p.key, len(cs)) for p, cs in jobs])
        return [[float(c.block_m * c.block_n) for c in cs] for _, cs in jobs]


def test_evolutionary_search_spends_its_budget_on_distinct_valid_configs():
    problem = GemmProblem(64, 4096, 4096)
    valid = valid_configs(space("full"), H200, problem)
    [trace] = run_searches([(problem, evolutionary_search(valid, space("full"), 30, random.Random(0)))], _MadeUpLaw())
    assert len(trace) == 30 and len({c for c, _ in trace}) == 30 and {c for c, _ in trace} <= set(valid)
    # it climbs: the later half finds bigger tiles than the random start on this made-up law
    assert max(t for _, t in trace[15:]) >= max(t for _, t in trace[:8])


def test_run_searches_measures_every_problem_of_a_step_in_one_batch():
    problems = [GemmProblem(m, 4096, 4096) for m in (16, 64, 256)]
    law = _MadeUpLaw()
    searches = [(p, evolutionary_search(valid_configs(space("full"), H200, p), space("full"), 20, random.Random(0)))
                for p in problems]
    searches.append((problems[0], random_search(valid_configs(space("full"), H200, problems[0]), 5, random.Random(1))))
    traces = run_searches(searches, law)
    assert [len(t) for t in traces] == [20, 20, 20, 5]
    # step 1 holds all four searches; then the three evolutionary ones go on together, 8 + 8 + 4
    assert law.calls[0] == [(p.key, 8) for p in problems] + [(problems[0].key, 5)]
    assert law.calls[1:] == [[(p.key, n) for p in problems] for n in (8, 4)]


def _fake_measured(tmp_path, problems: int, configs: int) -> tuple[str, Path]:
    """A database of `problems` test problems measured by the fake runner, and a tiny random policy."""
    db = str(tmp_path / "m.sqlite")
    collect(CollectArgs(db=db, gpu="h200", split="test", problems=problems, configs=configs,
                        runner="fake_runner:measure"))
    torch.manual_seed(0)
    ckpt = tmp_path / "p.pt"
    save_checkpoint(PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,))), ckpt)
    return db, ckpt


def test_bench_measures_every_method_within_the_budget(tmp_path):
    db, ckpt = _fake_measured(tmp_path, problems=2, configs=10)
    out = run(BenchArgs(db=db, gpu="h200", budgets="1,2,4,8", checkpoint=str(ckpt), runner="fake_runner:measure",
                        out=str(tmp_path / "bench"), shard_dir=str(tmp_path / "shards"), log_dir=str(tmp_path / "runs")))
    assert out["problems"] == 2 and out["measured"] > 0 and out["shard_rows"] == out["measured"]
    rows = list(csv.DictReader((tmp_path / "bench" / "bench.csv").open()))
    methods = {"policy", "triton_tutorial", "inductor_mm", "seed", "random", "evolutionary", "analytic"}
    assert {r["method"] for r in rows} == methods and len(rows) == 2 * len(methods) * 4
    for problem in {r["problem"] for r in rows}:
        for m in methods:
            curve = [float(r["fraction"]) for r in rows if r["problem"] == problem and r["method"] == m]
            assert curve == sorted(curve) and max(curve) <= 1.0 + 1e-9
    assert "| policy |" in out["report"] and (tmp_path / "bench" / "bench.png").stat().st_size > 10_000
    assert list((tmp_path / "runs" / "wandb").glob("offline-run-*"))
    # a simulated runner's figures never reach the checkpoint's card
    assert out["card"].startswith("not updated") and not (tmp_path / "p.card.json").exists()

    # the report rebuilt from the CSV alone (a GPU machine without wandb wrote it) is the same report
    (tmp_path / "bench" / "bench.md").unlink()
    again = run(BenchArgs(db=db, checkpoint=str(ckpt), out=str(tmp_path / "bench"), log_dir=str(tmp_path / "runs2"),
                          report_only=True))
    assert again["report"] == out["report"] and (tmp_path / "bench" / "bench.md").read_text().strip() == out["report"]
    card = json.loads((tmp_path / "p.card.json").read_text())["bench"]
    assert card["problems"] == 2 and set(card["fraction_of_best_known"]) == methods
    assert set(card["fraction_of_best_known"]["policy"]) == {"1", "2", "4", "8"} and "all" in card["policy_vs_cublas"]
    assert list((tmp_path / "runs2" / "wandb").glob("offline-run-*"))


def test_a_time_limited_bench_stores_what_it_measured_and_a_rerun_finishes(tmp_path, monkeypatch):
    import training.bench as bench

    db, ckpt = _fake_measured(tmp_path, problems=3, configs=6)
    args = dict(db=db, gpu="h200", budgets="1,2", checkpoint=str(ckpt), runner="fake_runner:measure",
                out=str(tmp_path / "bench"), shard_dir=str(tmp_path / "shards"), wandb=False)
    clock = iter(range(0, 10**6, 40))  # each reading 40 s later: a 1.5-minute limit admits two problems
    monkeypatch.setattr(bench, "monotonic", lambda: next(clock))
    first = run(BenchArgs(**args, time_limit=1.5))
    assert first["stopped_by_time_limit"] == 1 and first["problems"] == 2 and first["shard_rows"] == first["measured"] > 0
    assert not (tmp_path / "bench" / "bench.csv").exists()
    monkeypatch.undo()
    second = run(BenchArgs(**args))
    assert second["problems"] == 3 and "stopped_by_time_limit" not in second
    # the first run's measurements were reused: only the third problem's configs are new
    assert 0 < second["measured"] < first["measured"]
    assert (tmp_path / "bench" / "bench.csv").exists()


class _Compiled:
    """What CompilePool.stream yields on a GPU machine, without compiling."""

    streams = 0

    def stream(self, jobs):
        self.streams += 1
        for problem, config in jobs:
            yield CompileResult(problem.key, config.key, "ok", 0.25)


class _Pool:
    def run(self, problem, configs):
        return list(fake_measure(problem, configs, gpu=H200.name))


def test_measurer_with_a_compile_stream_tallies_into_a_fresh_defaultdict(tmp_path):
    # the path bench and transfer take on a GPU machine: compile results first, then the pool
    problem = GemmProblem(64, 4096, 4096)
    configs = valid_configs(space("full"), H200, problem)[:3]
    counts = defaultdict(int)
    with Database(str(tmp_path / "m.sqlite")) as db:
        values = Measurer(db, H200, _Pool(), _Compiled(), counts)(problem, configs)
    assert values == [float(c.block_m) for c in configs]
    assert counts["measured"] == 3 and counts["compile_cpu_s"] == 0.75


def test_measurer_many_compiles_every_job_in_one_stream_and_measures_a_repeated_pair_once(tmp_path):
    problems = [GemmProblem(64, 4096, 4096), GemmProblem(128, 4096, 4096)]
    configs = [valid_configs(space("full"), H200, p)[:3] for p in problems]
    compiled = _Compiled()
    counts = defaultdict(int)
    with Database(str(tmp_path / "m.sqlite")) as db:
        measure = Measurer(db, H200, _Pool(), compiled, counts)
        values = measure.many([(problems[0], configs[0]), (problems[1], configs[1]), (problems[0], configs[0][:1])])
        assert values == [[float(c.block_m) for c in cs] for cs in (configs[0], configs[1], configs[0][:1])]
        assert counts["measured"] == 6 and counts["compile_cpu_s"] == 1.5  # 6 compiles, one stream
        assert compiled.streams == 1
        assert measure.many([(problems[1], configs[1])]) == [values[1]] and compiled.streams == 1  # all stored


def test_local_measurer_simulates_with_the_analytic_model_or_runs_the_worker_without_a_compiler_off_the_gpu(tmp_path):
    from gnn_policy.measure.simulator import SimulatedPool, load_fitted
    from gnn_policy.measure.workers import WorkerPool
    from gnn_policy.search import local_measurer

    problem = GemmProblem(64, 4096, 4096)
    configs = valid_configs(space("full"), H200, problem)[:2]
    analytic = load_fitted(Path(__file__).resolve().parent.parent / "checkpoints" / "analytic.json")
    with Database(str(tmp_path / "m.sqlite")) as db:
        with local_measurer(db, H200, defaultdict(int), "fake_runner:measure", 30, simulated=analytic) as measure:
            assert isinstance(measure.pool, SimulatedPool) and measure.compiler is None
            assert measure.source == "simulated"
            simulated = measure(problem, configs)
        assert simulated == pytest.approx(analytic.predict_tflops(problem, configs, H200), rel=1e-6)
        with local_measurer(db, H200, defaultdict(int), "fake_runner:measure", 30) as measure:
            # a test's runner on a machine without CUDA: the worker measures, nothing compiles ahead
            assert isinstance(measure.pool, WorkerPool) and measure.compiler is None
            assert measure.source == "real" and len(measure(problem, configs)) == 2
        assert len(db.measured(H200.name, "simulated", problem=problem.key)) == 2
        assert len(db.measured(H200.name, "real", problem=problem.key)) == 2
