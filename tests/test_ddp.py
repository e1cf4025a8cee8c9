"""Training in two processes on the CPU (Lightning DDP, gloo): pretraining gives one process's card
and metrics within noise and writes its outputs once; meta-pretraining's ranks draw different
tasks from the one seeded stream."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnn_policy.collect import select_problems
from gnn_policy.measure.simulator import load_fitted
from gnn_policy.space import space
from hardware_specs.features import GpuVocab
from test_pretrain import _fake_db
from training import ddp, meta_data
from training.meta_pretrain import ANALYTIC
from training.pretrain import PretrainArgs, run
from training.tasks import Simulation, build_tasks

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_two_processes_pretrain_like_one_and_rank_0_alone_writes(tmp_path):
    _fake_db(tmp_path / "m.sqlite")
    flags = dict(db=str(tmp_path / "m.sqlite"), epochs=3, batch_size=4, hidden=16, layers=1, seed=0)
    one = run(PretrainArgs(**flags, out=str(tmp_path / "one"), log_dir=str(tmp_path / "runs1"), wandb=False))
    cmd = [sys.executable, "-m", "gnn_policy.cli", "pretrain", "--devices", "2", "--out", str(tmp_path / "two"),
           "--log-dir", str(tmp_path / "runs2"), *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items())]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    card = json.loads((tmp_path / "two" / "pretrained.card.json").read_text())
    printed = out.stdout[out.stdout.rindex("\n{"):]  # after the progress bars
    assert json.loads(printed) == card["metrics"] and out.stdout.count('"train/loss"') == 1  # by rank 0 alone
    assert card["data"] == one["data"] and card["epochs_run"] == one["epochs_run"] == 3
    assert set(card["metrics"]) == set(one["metrics"])
    # the same optimiser steps over the same problems in another order: seeds 0-3 of one process
    # spread train/loss over 13.06-13.21 (sd 0.07); two processes land 0.012 from seed 0's
    assert card["metrics"]["train/loss"] == pytest.approx(one["metrics"]["train/loss"], abs=0.05)
    assert len(list((tmp_path / "runs2" / "wandb").glob("offline-run-*"))) == 1
    assert len(list((tmp_path / "runs2" / "csv").rglob("metrics.csv"))) == 1


def test_two_processes_meta_pretrain_with_a_task_each_per_meta_step(tmp_path):
    from training.meta_pretrain import MetaPretrainArgs, run as meta_run

    flags = dict(db=str(tmp_path / "m.sqlite"), simulate=("a100", "l4"), problems=2, configs=4, val_problems=2,
                 epochs=1, steps_per_epoch=2, inner_steps=1, batch_size=2, hidden=8, layers=1, imitation_weight=0.0)
    one = meta_run(MetaPretrainArgs(**flags, out=str(tmp_path / "one"), log_dir=str(tmp_path / "runs1"), wandb=False))
    cmd = [sys.executable, "-m", "gnn_policy.cli", "meta-pretrain", "--devices", "2", "--out", str(tmp_path / "two"),
           "--log-dir", str(tmp_path / "runs2"), "--no-wandb",
           *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items() if k != "simulate"),
           *(f"--simulate={g}" for g in flags["simulate"])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    card = json.loads((tmp_path / "two" / "meta.card.json").read_text())
    assert card["algorithm"]["tasks_per_meta_step"] == 2 and card["meta_steps_run"] == one["meta_steps_run"] == 2
    assert out.stdout.count('"train/meta_loss"') == 1
    # before any meta-step both runs validate rank 0's seeded weights on the same held-out data
    start = {k: v for k, v in card["metrics"].items() if k.endswith("_at_start")}
    assert start == pytest.approx({k: one["metrics"][k] for k in start}, abs=1e-4)


def test_the_batch_is_split_over_the_devices_or_refused():
    with pytest.raises(ValueError, match="--batch-size 6 cannot be split evenly over --devices 4"):
        run(PretrainArgs(batch_size=6, devices=4))
    assert ddp.trainer_options(1) == {"accelerator": "auto", "devices": 1}
    options = ddp.trainer_options(2, task_parallel=True)
    assert options["accelerator"] == "cpu" and isinstance(options["strategy"], ddp.TaskParallel)
    assert options["strategy"].process_group_backend == "gloo"


def test_meta_ranks_draw_alternate_tasks_of_the_one_seeded_stream(monkeypatch):
    sim = Simulation(load_fitted(ANALYTIC), space("full"), configs=4, seed=0)
    tasks = build_tasks(("h200",), ("a100", "l4", "l40s", "h100"), sim, select_problems("train", 2, 0))
    vocab = GpuVocab(tuple(t.gpu for t in tasks))

    def drawn(rank: int, world: int, length: int) -> list[str]:
        monkeypatch.setattr(meta_data, "process_rank", lambda: (rank, world))
        return [b.gpu for b in meta_data.TaskStream(tasks, length, 1, 2, sim.space, vocab, seed=0)]

    single = drawn(0, 1, 12)
    assert drawn(0, 2, 6) == single[0::2] and drawn(1, 2, 6) == single[1::2]
    assert len(set(single)) > 2
