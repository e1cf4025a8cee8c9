"""gnn-policy confirm with a fake runner: who is re-timed, in what order, stored and resumed."""
import gzip
import json
import random
from collections import Counter

from gnn_policy.collect import CollectArgs, run as collect
from gnn_policy.confirm import ConfirmArgs, contenders, run as confirm, schedule
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS, Measurement, Retime
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig

GPU = "H200-SXM-141GB"


def test_contenders_are_the_fastest_configs_and_cublas():
    figures = {"a": 10.0, "b": 30.0, "c": 20.0, CUBLAS: 50.0}
    assert contenders(figures, 2) == ["b", "c", CUBLAS]


def test_every_round_times_each_contender_once_in_a_new_order():
    keys = [f"k{i}" for i in range(6)]
    sched = schedule(keys, 4, random.Random(0))
    rounds = [[k for r, k in sched if r == i] for i in range(4)]
    assert all(sorted(r) == keys for r in rounds) and len({tuple(r) for r in rounds}) > 1


def test_confirm_stores_retimes_resumes_and_ships_them(tmp_path):
    db = str(tmp_path / "m.sqlite")
    collect(CollectArgs(db=db, gpu="h200", split="test", problems=2, configs=6, runner="fake_runner:measure"))
    args = ConfirmArgs(db=db, gpu="h200", top=2, rounds=3, runner="fake_runner:measure",
                       shard_dir=str(tmp_path / "shards"))
    first = confirm(args)
    assert first["problems_done"] == 2 and first["retimed"] == 2 * 3 * 3 and first["shard_rows"] == 18
    assert confirm(args).get("problems_done", 0) == 0  # resumed: nothing left
    shard, = (tmp_path / "shards").iterdir()
    rows = [json.loads(line) for line in gzip.open(shard, "rt")]
    assert {r["kind"] for r in rows} == {"retime"}
    per_problem = Counter((r["problem"], r["config"]) for r in rows)
    assert set(per_problem.values()) == {3} and sum(r["config"] == CUBLAS for r in rows) == 6


def test_retimes_move_best_known_to_the_median_of_all_timings(tmp_path):
    db_path = str(tmp_path / "m.sqlite")
    collect(CollectArgs(db=db_path, gpu="h200", split="test", problems=1, configs=6, runner="fake_runner:measure"))
    with Database(db_path) as db:
        p = db.problems(GPU)[0]
        problem = p.key
        key, tflops = db.best_known(GPU, problem)  # fake runner: median 1 ms, TFLOP/s = BLOCK_M
        config = TileConfig.from_key(key)
        db.add_retimes([(Retime(GPU, problem, key, "later", r, "ok", ms), p, config)
                        for r, ms in enumerate((2.0, 4.0))])
        # timings 1, 2 and 4 ms: the median (2 ms) halves the figure
        assert db.tflops(GPU, problem)[key] == tflops / 2
        # under other software the re-timing is another measurement's business: ignored here
        db.add_retimes([(Retime(GPU, problem, key, "newer", 0, "ok", 100.0, versions="triton 9"), p, config)])
        assert db.tflops(GPU, problem)[key] == tflops / 2


def test_a_retime_shard_loads_without_the_shard_of_its_measurements(tmp_path):
    db = str(tmp_path / "m.sqlite")
    collect(CollectArgs(db=db, gpu="h200", split="test", problems=1, configs=4, runner="fake_runner:measure"))
    confirm(ConfirmArgs(db=db, gpu="h200", runner="fake_runner:measure", shard_dir=str(tmp_path / "s")))
    with Database(tmp_path / "fresh.sqlite") as fresh:
        assert load_shipped(fresh, tmp_path / "s") == 4 * 3  # top 3 + cuBLAS, 3 rounds
        assert fresh.retimed(GPU) == {}  # nothing to count them against here


def test_a_problem_whose_top_changed_is_confirmed_again(tmp_path):
    db_path = str(tmp_path / "m.sqlite")
    collect(CollectArgs(db=db_path, gpu="h200", split="test", problems=2, configs=6, runner="fake_runner:measure"))
    args = ConfirmArgs(db=db_path, gpu="h200", top=2, rounds=2, runner="fake_runner:measure")
    assert confirm(args)["problems_done"] == 2
    with Database(db_path) as db:  # a later run (bench, say) finds a faster config for one problem
        p = db.problems(GPU)[0]
        measured = set(db.tflops(GPU, p.key))
        newcomer = next(c for c in (TileConfig(block_m=256, block_n=n, block_k=64) for n in (16, 32, 64, 128))
                        if c.key not in measured)
        versions = db.conn.execute("SELECT versions FROM measurements LIMIT 1").fetchone()[0]
        db.add([(Measurement(GPU, p.key, newcomer.key, "ok", median_ms=0.1, tflops=1e4, versions=versions),
                 p, newcomer)])
    again = confirm(args)
    assert again["problems_done"] == 1
    with Database(db_path) as db:
        assert newcomer.key in db.retimed(GPU)[p.key]
    assert confirm(args).get("problems_done", 0) == 0
