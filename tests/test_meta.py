"""Meta-pretraining (Reptile over GPU tasks) on small simulated tasks on the CPU: the outer step
is exact, a tiny seeded run ships a loadable checkpoint without the held-out GPU, adaptation
from the meta weights lowers a task's loss, and bad GPU lists are clear errors."""
import json
import random
import subprocess
from collections import Counter
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

import hardware_specs
from graphs.classes import split_of
from graphs.suite import split
from gnn_policy.collect import select_problems
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.measure.simulator import load_fitted
from gnn_policy.model import ModelConfig
from gnn_policy.policy import Policy
from gnn_policy.search import valid_configs
from gnn_policy.space import space
from hardware_specs.features import GpuVocab
from training import meta
from training.meta import ReptileConfig, ReptileModule, inner_optimizer, inner_steps, score
from training.meta_data import MetaDataModule, Step
from training.meta_pretrain import ANALYTIC, MetaPretrainArgs, run
from training.dataset import collate
from training.objective import LossWeights
from training.tasks import Simulation, TaskError, build_tasks, held_out, role_problems

H200 = hardware_specs.load("h200")
SLICE = hardware_specs.load("h200-sm64")
SIM = Simulation(load_fitted(ANALYTIC), space("full"), configs=8, seed=0)


def _real_rows(path, gpus=(H200, SLICE)):
    """Made-up real measurements of three train-family problems on each GPU."""
    rng = random.Random(0)
    problems = [p for p in split("train") if p.dtype == "bf16"][:3]
    with Database(path) as db:
        for gpu in gpus:
            for p in problems:
                configs = rng.sample(valid_configs(space("full"), gpu, p), 6)
                db.add((Measurement(gpu.name, p.key, c.key, "ok", median_ms=1.0, tflops=10 + rng.random() * 90), p, c)
                       for c in configs)


def _tiny(reptile: ReptileConfig, steps_per_epoch: int) -> tuple[ReptileModule, MetaDataModule, pl.Trainer]:
    """A seeded tiny Reptile module on two simulated GPUs (H200 held out), its data and a quiet Trainer."""
    pl.seed_everything(0)
    tasks = build_tasks(("h200",), ("a100", "l4"), SIM, select_problems("train", 6, 0))
    cfg = ModelConfig(hidden=8, layers=1, gpu_names=tuple(t.gpu for t in tasks))
    data = MetaDataModule(tasks, [], SIM.space, GpuVocab(cfg.gpu_names), steps_per_epoch=steps_per_epoch,
                          inner_steps=reptile.inner_steps, batch_size=2, seed=0)
    trainer = pl.Trainer(max_epochs=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    return ReptileModule(cfg, reptile), data, trainer


def test_one_outer_step_is_meta_plus_epsilon_times_the_displacement(monkeypatch):
    module, data, trainer = _tiny(ReptileConfig(inner_steps=3, epsilon=0.3, meta_steps=1), steps_per_epoch=1)
    start = [p.detach().clone() for p in module.model.parameters()]
    seen = {}

    def recording(params, meta_, epsilon):
        seen.update(adapted=[p.detach().clone() for p in params], meta=[m.clone() for m in meta_], epsilon=epsilon)
        return real(params, meta_, epsilon)

    real = meta.reptile_update
    monkeypatch.setattr(meta, "reptile_update", recording)
    trainer.fit(module, datamodule=data)
    assert seen["epsilon"] == 0.3
    assert all(torch.equal(m, s) for m, s in zip(seen["meta"], start))  # the meta weights are those before the step
    assert any(not torch.equal(a, m) for a, m in zip(seen["adapted"], seen["meta"]))  # the inner steps moved
    for p, a, m in zip(module.model.parameters(), seen["adapted"], seen["meta"]):
        assert torch.equal(p.detach(), m + 0.3 * (a - m))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("meta")
    _real_rows(tmp / "m.sqlite")
    args = MetaPretrainArgs(db=str(tmp / "m.sqlite"), simulate=("a100", "l4", "h200"), problems=6, configs=8,
                            val_problems=4, epochs=2, steps_per_epoch=2, inner_steps=2, batch_size=2, hidden=16,
                            layers=1, out=str(tmp / "ckpt"), log_dir=str(tmp / "runs"), wandb=False)
    card = run(args)  # the default analytic model was fitted on slices only: no label saw the H200
    assert H200.name not in card["simulator"]["fitted_on"]
    return tmp, card


def test_labels_from_an_analytic_model_fitted_on_the_held_out_gpu_are_warned_of(tiny_run):
    tmp, _ = tiny_run
    args = MetaPretrainArgs(db=str(tmp / "m.sqlite"), simulate=("l4",), problems=2, configs=4, val_problems=2,
                            epochs=1, steps_per_epoch=1, inner_steps=1, batch_size=2, hidden=8, layers=1,
                            analytic=str(Path(ANALYTIC).with_name("analytic.json")), out=str(tmp / "ckpt2"),
                            log_dir=str(tmp / "runs2"), wandb=False)
    with pytest.warns(UserWarning, match="fitted on H200-SXM-141GB, which is held out"):
        run(args)


def test_a_tiny_run_ships_a_loadable_checkpoint_without_the_held_out_gpu(tiny_run):
    tmp, card = tiny_run
    by_gpu = {t["gpu"]: t for t in card["tasks"]}
    # the slice's real rows replace its simulation; the imported GPUs come with their demonstrations
    assert by_gpu[SLICE.name]["source"] == "real" and by_gpu[SLICE.name]["problems"] == 3
    assert by_gpu["A100-SXM4-80GB"]["source"] == "simulated" and by_gpu["A100-SXM4-80GB"]["demonstrations"] > 0
    assert by_gpu["MI300X"]["source"] == "none" and by_gpu["MI300X"]["demonstrations"] > 0
    assert by_gpu["L4"] == {"gpu": "L4", "source": "simulated", "problems": 6, "configs": 48, "demonstrations": 0}
    assert card["hold_out"] == [H200.name] and H200.name not in by_gpu
    assert H200.name not in card["model_config"]["gpu_names"]
    assert card["meta_steps_run"] == 4 and card["algorithm"]["name"] == "reptile"
    assert {"train/meta_loss", "train/inner_loss_first", "train/inner_loss_last", "val/adaptation_gain",
            "val/top1_after", "val/loss_before_at_start"} <= set(card["metrics"])
    policy = Policy.load(tmp / "ckpt" / "meta.pt")
    assert policy.top_k(split("test")[0], H200, k=2)
    assert json.loads((tmp / "ckpt" / "meta.card.json").read_text())["metrics"] == card["metrics"]
    csv = next((tmp / "runs" / "csv").rglob("metrics.csv")).read_text()
    assert "train/meta_loss" in csv and "val/adaptation_gain" in csv


def test_inner_steps_from_the_meta_weights_lower_a_new_gpus_loss(tiny_run):
    tmp, _ = tiny_run
    torch.manual_seed(0)
    model = Policy.load(tmp / "ckpt" / "meta.pt").model.train()
    (held,) = held_out(("h200",), SIM, select_problems("train", 4, 1), [])
    vocab = GpuVocab(model.cfg.gpu_names)
    task = Step(collate(held.support, SIM.space, vocab), None)
    weights = LossWeights()
    before = score(model, task, weights)["loss"]
    inner_steps(model, [task] * 5, inner_optimizer(model.parameters(), ReptileConfig()), torch.Tensor.backward, weights)
    assert score(model, task, weights)["loss"] < before - 0.05


def test_unknown_gpus_and_an_empty_task_list_are_clear_errors(tmp_path):
    problems = select_problems("train", 2, 0)
    with pytest.raises(hardware_specs.SpecError, match="--hold-out: unknown GPU 'h300'"):
        build_tasks(("h300",), ("a100",), SIM, problems)
    with pytest.raises(hardware_specs.SpecError, match="--simulate: unknown GPU 'a1000'"):
        build_tasks(("h200",), ("a100", "a1000"), SIM, problems)
    with pytest.raises(TaskError, match=r"no task is left after the hold-out \(A100-SXM4-80GB\)"):
        build_tasks(("a100",), ("A100-SXM4-80GB",), SIM, problems)
    with pytest.raises(TaskError, match="hold out at least one GPU"):
        held_out((), SIM, problems, problems)
    out = subprocess.run([sys.executable, "-m", "gnn_policy.cli", "meta-pretrain", "--db", str(tmp_path / "m.sqlite"),
                          "--simulate", "a100", "--hold-out", "a100", "--imitation-weight", "0", "--no-wandb"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "gnn-policy meta-pretrain: no task is left after the hold-out" in out.stderr


@pytest.mark.parametrize("plain", [False, True])
def test_plain_mode_keeps_one_adam_and_takes_no_reptile_step(plain):
    reptile = ReptileConfig(inner_steps=2, epsilon=1.0, epsilon_end=1.0, fresh_inner=False) if plain else \
        ReptileConfig(inner_steps=2, epsilon=0.5, meta_steps=3)
    module, data, trainer = _tiny(reptile, steps_per_epoch=3)
    trainer.fit(module, datamodule=data)
    steps = {int(s["step"]) for s in trainer.optimizers[0].state.values()}
    assert steps == ({6} if plain else {2})  # 3 tasks x 2 steps on one Adam, or a fresh Adam per task


def test_the_cli_writes_the_plain_comparator_beside_the_meta_checkpoint(tmp_path):
    card = run(MetaPretrainArgs(db=str(tmp_path / "m.sqlite"), simulate=("a100", "h200"), problems=2,
                                random_problems=1, configs=4, val_problems=2, random_val_problems=1, epochs=1,
                                steps_per_epoch=1, inner_steps=1, batch_size=2, hidden=8, layers=1,
                                imitation_weight=0, out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"),
                                wandb=False, plain=True, floored_bound=True))
    assert card["checkpoint"] == "plain.pt" and card["algorithm"]["name"] == "plain multi-task"
    assert Policy.load(tmp_path / "ckpt" / "plain.pt").model.cfg.floored_bound  # as pretrained.pt's
    assert card["tasks"][0]["problems"] == 3 and card["validation"]["query_problems"] == 3  # suite + random
    assert card["algorithm"]["epsilon"] == card["algorithm"]["epsilon_end"] == 1.0
    assert Policy.load(tmp_path / "ckpt" / "plain.pt") and (tmp_path / "ckpt" / "plain.card.json").exists()
    assert not (tmp_path / "ckpt" / "meta.pt").exists()


def test_tasks_and_validation_read_training_and_validation_problems_alone(tmp_path):
    from test_datamodule import PROBLEMS, keys_of, split_rows

    split_rows(tmp_path / "m.sqlite", SLICE)  # every split, test ones and a tuned shape included
    with Database(tmp_path / "m.sqlite") as db:
        (task,) = build_tasks(("h200",), (), SIM, [], db)
    assert task.gpu == SLICE.name and task.source == "real"
    assert {s.problem.key for s in task.samples} == keys_of("train", "random-train")
    simulated = role_problems("train", 2, 3, 0)
    assert Counter(split_of(p) for p in simulated) == {"train": 2, "random-train": 3}
    assert Counter(split_of(p) for p in role_problems("val", 2, 1, 0)) == {"val": 2, "random-val": 1}
    assert role_problems("train", 2, 0, 0) == select_problems("train", 2, 0)  # no random ones: as before
    with pytest.raises(TaskError, match="simulated tasks' problems must be train problems .* random-test"):
        build_tasks(("h200",), ("a100",), SIM, [*simulated, *PROBLEMS["random-test"]])
    with pytest.raises(TaskError, match="query problems must be val problems .* test"):
        held_out(("h200",), SIM, simulated, PROBLEMS["test"])
    with pytest.raises(TaskError, match="support problems must be train problems .* random-val"):
        held_out(("h200",), SIM, PROBLEMS["random-val"], [])


def test_real_weight_draws_tasks_of_real_rows_that_many_times_as_often():
    from training.meta_data import TaskStream
    from training.tasks import Task

    tasks = build_tasks(("h200",), ("a100", "l4"), SIM, select_problems("train", 2, 0))
    real = Task(SLICE.name, "real", tasks[0].samples, [])  # the same samples, labelled as a slice's real rows
    vocab = GpuVocab(tuple(t.gpu for t in [*tasks, real]))
    drawn = [b.gpu for b in TaskStream([*tasks, real], 600, 1, 2, SIM.space, vocab, seed=0, real_weight=4.0)]
    assert 0.6 < drawn.count(SLICE.name) / len(drawn) < 0.73  # 4 / (4 + 1 + 1)
    even = [b.gpu for b in TaskStream([*tasks, real], 600, 1, 2, SIM.space, vocab, seed=0)]
    assert 0.27 < even.count(SLICE.name) / len(even) < 0.4  # one in three
