"""A tiny seeded pretraining run on a synthetic database: it trains, logs, and writes a loadable
checkpoint with its card; its loss is pinned."""
import dataclasses
import json
import math
import random

import pytest
import torch

import hardware_specs
from graphs.suite import split
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.space import TileConfig, space, tma_fits, violations
from training.pretrain import PretrainArgs, run

GPU = hardware_specs.load("h200")


def _fake_db(path, space_name="full"):
    """A made-up speed law: bigger tiles are faster on big problems, split-K helps small M."""
    rng = random.Random(0)
    valid = [c for c in space(space_name) if not violations(c, GPU, "bf16")]
    problems = [p for p in split("train") if p.dtype == "bf16"][:6] + [p for p in split("val") if p.dtype == "bf16"][:3]
    with Database(path) as db:
        for p in problems:
            rows = []
            for c in rng.sample(valid, 12):
                tile = math.log2(c.block_m * c.block_n) / 16
                tflops = 100 * tile * (1 + 0.3 * (c.split_k > 1) * (p.m <= 64)) + rng.random()
                status = "ok" if c.block_k < 256 else "compile_error"
                rows.append((Measurement(GPU.name, p.key, c.key, status, median_ms=1.0 if status == "ok" else None,
                                         tflops=tflops if status == "ok" else None), p, c))
            db.add(rows)


# measured with torch 2.13.0 (CPU), seed 0: the roofline-bounded cost head with named rows at 0.25 and
# its listwise loss at 3, and the first checkpoints' model (unbounded cost head with tile geometry, every
# row weighing 1, no listwise loss on the cost head), whose
# figure is the one pinned before the bounded head existed: that path trains exactly as it did
PINNED_LOSS = {1: 18.75375, 0: 13.13282}


@pytest.mark.parametrize("cost_model", [1, 0])
def test_a_tiny_seeded_run_trains_and_ships_a_loadable_checkpoint(tmp_path, cost_model):
    _fake_db(tmp_path / "m.sqlite")
    args = PretrainArgs(db=str(tmp_path / "m.sqlite"), epochs=3, batch_size=3, hidden=16, layers=1,
                        out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"), seed=0, cost_model=cost_model,
                        named_weight=0.25 if cost_model else 1.0, cost_listwise=3.0 if cost_model else 0.0,
                        wandb=cost_model == 1)  # one W&B run a process
    card = run(args)
    assert card["data"]["train"]["problems"] == 6 and card["data"]["val"]["problems"] == 3
    assert card["data"]["train"]["problems_by_split"] == {"train": 6}
    assert card["roles"]["train"] == ["train", "random-train"]
    assert card["epochs_run"] == 3 and card["gpus"] == [GPU.name]
    assert card["model_config"]["cost_model"] == cost_model
    assert card["metrics"]["train/loss"] == pytest.approx(PINNED_LOSS[cost_model], abs=1e-3)
    state = torch.load(tmp_path / "ckpt" / "pretrained.pt", weights_only=True)
    model = PolicyModel(ModelConfig(**{k: tuple(v) if isinstance(v, list) else v
                                       for k, v in state["model_config"].items()}))
    model.load_state_dict(state["state_dict"])
    assert json.loads((tmp_path / "ckpt" / "pretrained.card.json").read_text())["metrics"] == card["metrics"]
    csv = next((tmp_path / "runs" / "csv").rglob("metrics.csv")).read_text()
    assert "train/loss" in csv and "val/top1_measured" in csv
    assert cost_model == 0 or list((tmp_path / "runs" / "wandb").glob("offline-run-*"))


def test_the_hopper_space_trains_a_policy_that_ranks_the_persistent_variant(tmp_path):
    from gnn_policy.policy import Policy

    _fake_db(tmp_path / "m.sqlite", "hopper")
    card = run(PretrainArgs(db=str(tmp_path / "m.sqlite"), epochs=1, batch_size=3, hidden=16, layers=1,
                            out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"), wandb=False,
                            space="hopper"))
    assert card["model_config"]["space"] == "hopper"
    policy = Policy.load(tmp_path / "ckpt" / "pretrained.pt")
    problem = next(p for p in split("test") if p.dtype == "bf16")
    ranked = policy.rank(problem, GPU, [TileConfig(128, 128, 64, 1, 8, 8, 3, v) for v in ("ptr", "tma", "persistent")])
    assert tma_fits(problem) and {c.variant for c, p in ranked if p > 0} == {"ptr", "tma", "persistent"}
    assert all(not violations(p.config, GPU, problem.dtype, problem.k) for p in policy.top_k(problem, GPU, 8))


def test_imitation_trains_on_imported_configs_and_logs_it(tmp_path):
    _fake_db(tmp_path / "m.sqlite")
    args = PretrainArgs(db=str(tmp_path / "m.sqlite"), epochs=1, batch_size=64, hidden=16, layers=1,
                        out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"), wandb=False,
                        imitation_weight=1.0)
    card = run(args)
    imported_gpus = ["A100-SXM4-80GB", "H100-SXM5-80GB", "L40S", "MI300X"]  # Mixtral (a train family) only
    assert card["imported"] == {"problems": 398, "demonstrations": 578, "gpus": imported_gpus}
    assert list(card["model_config"]["gpu_names"]) == sorted([GPU.name, *imported_gpus])
    assert card["metrics"]["train/imitation"] > 0
    assert card["data"]["train"]["problems"] == 6  # the measured samples are what they were


def test_the_weight_average_is_what_validates_and_ships(tmp_path):
    from training.module import PolicyModule
    from training.pretrain import ema_decay_flag

    module = PolicyModule(ModelConfig(hidden=16, layers=1, gpu_names=(GPU.name,)), ema_decay=0.75)
    optimised = {id(p) for group in module.configure_optimizers().param_groups for p in group["params"]}
    assert optimised == {id(p) for p in module.model.parameters()}  # the average is never stepped
    start = {k: v.clone() for k, v in module.model.state_dict().items()}
    module.on_train_batch_end()  # the first update copies the weights
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(1.0)
    module.on_train_batch_end()
    averaged = module.shipped.state_dict()
    for name, p in module.model.named_parameters():
        assert torch.allclose(averaged[name], start[name] + 0.25)  # 0.75 x old + 0.25 x new
    assert module.shipped is not module.model and PolicyModule(module.model.cfg).shipped is not None
    for bad in ("1", "1.5", "-0.1"):
        with pytest.raises(Exception, match="below 1|at least 0"):
            ema_decay_flag(bad)

    _fake_db(tmp_path / "m.sqlite")
    args = PretrainArgs(db=str(tmp_path / "m.sqlite"), epochs=2, batch_size=3, hidden=16, layers=1,
                        out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"), seed=0, wandb=False)
    plain = run(args)["metrics"]
    averaged_run = run(dataclasses.replace(args, ema_decay=0.9, out=str(tmp_path / "ema")))["metrics"]
    assert averaged_run["train/loss"] == pytest.approx(plain["train/loss"])  # training itself is unchanged
    assert averaged_run["val/loss"] != pytest.approx(plain["val/loss"])  # val reads the average
    raw = torch.load(tmp_path / "ckpt" / "pretrained.pt", weights_only=True)["state_dict"]
    ema = torch.load(tmp_path / "ema" / "pretrained.pt", weights_only=True)["state_dict"]
    assert raw.keys() == ema.keys() and any(not torch.equal(raw[k], ema[k]) for k in raw)


def test_train_share_config_share_and_train_on_val_change_the_training_set_and_the_card_says_so(tmp_path):
    from training.pretrain import share_flag

    _fake_db(tmp_path / "m.sqlite")
    args = PretrainArgs(db=str(tmp_path / "m.sqlite"), epochs=1, batch_size=3, hidden=16, layers=1,
                        out=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "runs"), seed=0, wandb=False)
    full = run(args)["data"]
    half = run(dataclasses.replace(args, train_share=0.5, out=str(tmp_path / "half")))
    both = run(dataclasses.replace(args, train_on_val=True, out=str(tmp_path / "both")))["data"]
    thin = run(dataclasses.replace(args, train_config_share=0.5, out=str(tmp_path / "thin")))
    assert full["train"]["problems"] == 6 and full["val"]["problems"] == 3
    assert 0 < half["data"]["train"]["problems"] < 6 and half["args"]["train_share"] == 0.5
    assert both["train"]["problems"] == 9 and both["train"]["problems_by_split"] == {"train": 6, "val": 3}
    assert thin["data"]["train"]["problems"] == 6 and thin["args"]["train_config_share"] == 0.5
    assert 0 < thin["data"]["train"]["measured_configs"] < full["train"]["measured_configs"]
    assert thin["data"]["val"]["measured_configs"] == full["val"]["measured_configs"]
    for bad, message in (("1.5", "at most 1"), ("0", "more than 0")):
        with pytest.raises(Exception, match=message):
            share_flag(bad)


def test_jobs_started_together_in_one_log_folder_write_apart(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from training.tracking import loggers; "
            "print(loggers(Path(sys.argv[1]), job_type='t', group='g', tags=(), config={}, wandb=False)[0].log_dir)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    dirs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert dirs[0] != dirs[1] and all(d.startswith(str(tmp_path / "csv")) for d in dirs)
