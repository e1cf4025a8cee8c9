"""Collecting under torchrun with two CPU ranks and the fake runner: the ranks' rows are exactly a
single process's, their shards merge without conflict, and a killed rank resumes; the helpers of
gnn_policy.distributed leave a run without torchrun as it was."""
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gnn_policy import distributed
from gnn_policy.collect import CollectArgs, run, select_problems
from gnn_policy.database import Database
from gnn_policy.measure import compile as compile_
from gnn_policy.snapshot import load_shipped

ROOT = Path(__file__).resolve().parent.parent
GPU = "H200-SXM-141GB"
SMALL = CollectArgs(db="", gpu="h200", split="test", problems=6, configs=3, named=("triton_tutorial",))
COLLECT = ["--gpu", "h200", "--split", "test", "--problems", "6", "--configs", "3", "--named", "triton_tutorial"]
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def become_rank(monkeypatch, rank: int) -> None:
    """This process as rank `rank` of two on one host (ranks share nothing, so one process can
    play them in turn); its GPU list left to restore."""
    for name, value in zip(TORCHRUN_ENV, (str(rank), "2", str(rank), "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def rows(path) -> set[tuple]:
    """Every measurement row of a database, without its id and time stamp."""
    with Database(path) as db:
        return {tuple(sorted((k, v) for k, v in r.items() if k != "problem_fields")) for r in db.rows_after(0)}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The rows one process measures: what two ranks must give together."""
    db = tmp_path_factory.mktemp("single") / "m.sqlite"
    run(dataclasses.replace(SMALL, db=str(db), runner="fake_runner:measure"))
    return rows(db)


def torchrun(db, *flags, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "gnn_policy.cli",
           "collect", "--db", str(db), *COLLECT, *flags]
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **(env or {})})


def test_without_torchrun_nothing_changes(no_torchrun, tmp_path):
    problems = select_problems("test", 5, seed=0)
    assert distributed.launch() == distributed.Launch()
    assert distributed.share(problems) == problems
    assert distributed.as_rank(str(tmp_path / "m.sqlite")) == str(tmp_path / "m.sqlite")
    assert distributed.shard_kind("") == "" and distributed.shard_kind("retime") == "retime"
    assert not list(tmp_path.iterdir())


def test_shares_are_disjoint_stable_and_cover_every_problem():
    problems = select_problems("all", 200, seed=0)
    shares = [[p for p in problems if distributed.owner(p.key, 4) == r] for r in range(4)]
    assert sorted(p.key for s in shares for p in s) == sorted(p.key for p in problems)
    assert min(map(len, shares)) > 30  # a hash spreads them, if not evenly
    assert distributed.owner(problems[0].key, 4) == distributed.owner(problems[0].key, 4)


def test_a_rank_measures_into_a_copy_of_the_database_and_names_its_shards(no_torchrun, monkeypatch, tmp_path):
    main = tmp_path / "m.sqlite"
    run(CollectArgs(db=str(main), gpu="h200", split="test", problems=1, configs=2, lists=False,
                    runner="fake_runner:measure"))
    become_rank(monkeypatch, 1)
    with pytest.warns(UserWarning, match="without --shard-dir its rows stay in"):
        mine = distributed.as_rank(str(main))
    assert mine == str(tmp_path / "m.rank1.sqlite") and rows(mine) == rows(main)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert distributed.shard_kind("") == "rank1" and distributed.shard_kind("retime") == "retime_rank1"
    assert distributed.part_path(tmp_path / "bench.csv").name == "bench.rank1of2.csv"


def test_a_rank_pins_its_gpu_and_compiles_on_its_share_of_the_cores(monkeypatch):
    become_rank(monkeypatch, 1)
    distributed.pin_device.__wrapped__(1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(RuntimeError, match="names 1 GPUs"):
        distributed.pin_device.__wrapped__(1)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert compile_.default_workers() == 7  # 8 cores each, one of them for the timing process


def test_rank_parts_merge_into_one_file_and_an_incomplete_set_is_refused(tmp_path):
    (tmp_path / "bench.rank0of2.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FileNotFoundError, match=r"ranks missing: \[1\]"):
        distributed.merge_parts(tmp_path / "bench.csv")
    (tmp_path / "bench.rank1of2.csv").write_text("")  # a rank that owned no problem
    assert distributed.merge_parts(tmp_path / "bench.csv") == 2
    assert (tmp_path / "bench.csv").read_text() == "a,b\n1,2\n" and [p.name for p in tmp_path.iterdir()] == ["bench.csv"]
    assert distributed.merge_parts(tmp_path / "bench.csv") == 0


def test_two_ranks_measure_exactly_what_one_process_does_and_their_shards_merge(single, tmp_path):
    out = torchrun(tmp_path / "m.sqlite", "--runner", "fake_runner:measure", "--shard-dir", str(tmp_path / "shards"))
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [rows(tmp_path / f"m.rank{r}.sqlite") for r in (0, 1)]
    assert ranks[0] and ranks[1] and not ranks[0] & ranks[1] and ranks[0] | ranks[1] == single
    assert len(list((tmp_path / "shards").iterdir())) == 2
    with Database(tmp_path / "merged.sqlite") as merged:
        assert load_shipped(merged, tmp_path / "shards") == len(single)  # no row ignored as a duplicate
    assert rows(tmp_path / "merged.sqlite") == single


def test_a_killed_rank_loses_its_problem_in_flight_and_a_rerun_resumes_every_rank(single, tmp_path):
    killed = torchrun(tmp_path / "m.sqlite", "--runner", "fake_runner:dying", env={"FAKE_RUNNER_KILL_RANK": "1"})
    assert killed.returncode != 0
    with Database(tmp_path / "m.rank1.sqlite") as db:
        problems, measured = db.problems(GPU), db.measured(GPU)
    assert len(problems) == 1  # its first problem, whole; the second was in flight
    assert {c for _, c in measured} == {dict(r)["config"] for r in single if dict(r)["problem"] == problems[0].key}
    again = torchrun(tmp_path / "m.sqlite", "--runner", "fake_runner:measure")
    assert again.returncode == 0, again.stderr[-3000:]
    assert rows(tmp_path / "m.rank0.sqlite") | rows(tmp_path / "m.rank1.sqlite") == single


def test_confirm_and_bench_ranks_take_their_shares_and_together_do_what_one_process_does(tmp_path, monkeypatch):
    import csv

    from gnn_policy.confirm import ConfirmArgs, run as confirm
    from gnn_policy.model import ModelConfig, PolicyModel
    from gnn_policy.policy import save_checkpoint
    from training.bench import BenchArgs, run as bench

    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    main = tmp_path / "m.sqlite"
    run(dataclasses.replace(SMALL, db=str(main), problems=4, configs=4, runner="fake_runner:measure"))
    save_checkpoint(PolicyModel(ModelConfig(hidden=8, layers=1, gpu_names=(GPU,))), tmp_path / "p.pt")
    shutil.copy(main, tmp_path / "one.sqlite")
    confirm_args = ConfirmArgs(db=str(tmp_path / "one.sqlite"), gpu="h200", top=2, rounds=2, runner="fake_runner:measure")
    bench_args = BenchArgs(db=str(tmp_path / "one.sqlite"), gpu="h200", budgets="1,2", checkpoint=str(tmp_path / "p.pt"),
                           runner="fake_runner:measure", out=str(tmp_path / "one"), wandb=False)

    def retimes(path):
        with Database(path) as db:
            return {(r["problem"], r["config"], r["round"], r["median_ms"]) for r in db.retimes_after(0)}

    def bench_rows(out):
        return {tuple(r.values()) for r in csv.DictReader((tmp_path / out / "bench.csv").open())}

    assert confirm(confirm_args)["problems_done"] == 4 and bench(bench_args)["problems"] == 4
    done = []
    for rank in (0, 1):
        become_rank(monkeypatch, rank)
        done.append(confirm(dataclasses.replace(confirm_args, db=str(main), shard_dir=str(tmp_path / "s")))["problems_done"])
        bench(dataclasses.replace(bench_args, db=str(main), out=str(tmp_path / "two"), shard_dir=str(tmp_path / "s")))
    assert all(done) and sum(done) == 4
    assert retimes(tmp_path / "m.rank0.sqlite") | retimes(tmp_path / "m.rank1.sqlite") == retimes(tmp_path / "one.sqlite")
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name)
    assert bench(dataclasses.replace(bench_args, out=str(tmp_path / "two"), report_only=True))["problems"] == 4
    assert bench_rows("two") == bench_rows("one")
