"""`gnn-policy meta-pretrain`: Reptile over GPU tasks (`training.meta`, `training.tasks`).

Tasks are the GPUs not held out: real measurements where the database has them (SM slices
included), the analytic model's labels for the GPUs to simulate, and imported vLLM / SGLang
demonstrations. A task's problems are training problems (`graphs.classes.ROLES`): a real
task's are every measured one of the train families and random-train; a simulated task's are
`--problems` of the train families and `--random-problems` of random-train. The held-out GPUs
(default: the full H200, which the transfer experiment holds out) are in no task; validation
adapts a copy of the meta weights to each of them with k inner steps on simulated train-family
problems and scores val-family (and `--random-val-problems` random-val) problems before and
after, at the start, after every epoch and at the end. No test problem of either kind is read.

Writes `<out>/meta.pt` in the format of pretrained.pt (the model's state_dict and its
ModelConfig: `Policy.load` and `gnn-policy finetune --checkpoint` read it) and
`<out>/meta.card.json` (tasks with their sources and sizes, hold-out, algorithm and
hyperparameters, metrics, versions, wall time). Metrics go to W&B (offline by default,
job_type meta-pretrain) and to a CSV under `--log-dir`.
"""
from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import hardware_specs
from gnn_policy.args import at_least, flag, positive
from gnn_policy.database import DEFAULT_PATH
from training.imported import TUNED_CONFIGS
from training.pretrain import cost_model_flag

if TYPE_CHECKING:  # the job's module stays light: the CLI imports it for the flags
    from gnn_policy.space import ConfigSpace
    from training.tasks import HeldOut, Task

# fitted on H200 slices only, so that the default hold-out (the full H200) leaks into no label
ANALYTIC = Path(__file__).resolve().parent.parent / "checkpoints" / "analytic-slices.json"
H200_SLICES = ("h200-sm16", "h200-sm32", "h200-sm64", "h200-sm96")  # multiples of 8: Hopper's slice granularity


@dataclasses.dataclass(frozen=True)
class MetaPretrainArgs:
    """Meta-pretrain the policy with Reptile over GPU tasks (real, simulated, imported); measure adaptation on held-out GPUs."""

    db: str = flag(str(DEFAULT_PATH), "the SQLite database; the shipped snapshot is loaded into it first")
    config: str = flag("", "a JSON file of these fields; flags given on the command line override it")
    hold_out: tuple[str, ...] = flag(("H200-SXM-141GB",), "GPUs in no task, from any source; validation "
                                     "adapts to each of them (repeatable)", action="append")
    simulate: tuple[str, ...] = flag((*hardware_specs.available(), *H200_SLICES),
                                     "GPUs whose tasks the analytic model labels, held-out ones left out (repeatable)",
                                     action="append")
    real: bool = flag(True, "make a task of every GPU with real rows in the database, SM slices included "
                            "(in place of its simulated task)", off="simulated and imported tasks only")
    real_weight: float = flag(1.0, "how many times as often a task of real rows is drawn as a simulated or "
                                   "imported one", check=positive)
    imitation_weight: float = flag(1.0, "weight of the imitation loss; the GPUs of the imported vLLM / SGLang "
                                        "configs become tasks (0: no imported data)", check=at_least(0, float))
    imported: str = flag(str(TUNED_CONFIGS), "folder of the imported tuned configs")
    analytic: str = flag(str(ANALYTIC), "the fitted analytic model that labels simulated samples")
    problems: int = flag(0, "train-family problems per simulated GPU, spread over the families (0: all)",
                         check=at_least(0))
    random_problems: int = flag(0, "random-train problems per simulated GPU besides the train families' "
                                   "(graphs/random_gemms.py; 0: none). Real tasks take every measured one",
                                check=at_least(0))
    configs: int = flag(64, "configs per simulated problem, stratified by (variant, SPLIT_K)", check=at_least(1))
    val_problems: int = flag(64, "val-family problems each held-out GPU is scored on", check=at_least(1))
    random_val_problems: int = flag(0, "random-val problems each held-out GPU is also scored on (0: none)",
                                    check=at_least(0))
    epochs: int = flag(40, "epochs; validation after each", check=at_least(1))
    steps_per_epoch: int = flag(50, "meta-steps (one task each) per epoch", check=at_least(1))
    inner_steps: int = flag(5, "k: Adam steps on one task per meta-step, and on a held-out GPU in validation",
                            check=at_least(1))
    inner_lr: float = flag(3e-4, "learning rate of the inner Adam (fresh for every task), as `gnn-policy finetune`'s",
                           check=positive)
    epsilon: float = flag(1.0, "Reptile's outer step size at the start, annealed linearly to --epsilon-end",
                          check=at_least(0, float))
    epsilon_end: float = flag(0.1, "Reptile's outer step size at the last meta-step", check=at_least(0, float))
    batch_size: int = flag(16, "problems per inner-step batch", check=at_least(1))
    hidden: int = flag(128, "width of the encoders and heads", check=at_least(1))
    layers: int = flag(3, "GINEConv layers", check=at_least(1))
    geometry: bool = flag(True, "feed the cost head the tile geometry (waves, padding, K steps; --cost-model 0)",
                          off="the cost head reads no tile geometry (as the first checkpoints)")
    cost_model: int = flag(1, "1: roofline-bounded cost head reading the analytic features, as pretrained.pt; "
                              "0: the first checkpoints' unbounded head (meta-cost0.pt, plain-cost0.pt)",
                           check=cost_model_flag)
    floored_bound: bool = flag(False, "the cost head's bound and roofline feature include the launch floor, as "
                                      "pretrained.pt's (needs --cost-model 1)")
    cost_listwise: float = flag(3.0, "weight of the cost head's listwise loss, as `gnn-policy pretrain`'s",
                                check=at_least(0, float))
    named_weight: float = flag(0.25, "weight of the named lists' rows in real tasks, as `gnn-policy pretrain`'s",
                               check=positive)
    temperature: float = flag(0.1, "listwise target temperature on log(TFLOP/s / best)", check=positive)
    seed: int = flag(0, "seed of weights, simulated configs, task draws and GPU-embedding dropout")
    out: str = flag("checkpoints", "folder for meta.pt (or plain.pt) and its card")
    log_dir: str = flag("runs/meta-pretrain", "folder for the CSV metrics and the offline W&B run")
    group: str = flag("meta-pretrain", "W&B group")
    tags: tuple[str, ...] = flag((), "W&B tags (repeatable)", action="append")
    wandb: bool = flag(True, "log to W&B (offline unless WANDB_MODE is set)", off="write no W&B run")
    max_minutes: float = flag(12.0, "stop meta-training after this many minutes", check=positive)
    devices: int = flag(1, "processes to meta-train in, one per GPU (without a GPU, CPU processes with gloo): "
                           "each meta-step averages the adapted weights of one task per process; rank 0 writes "
                           "the outputs")
    plain: bool = flag(False, "train plainly on the same tasks instead (one Adam throughout, no Reptile step, "
                              "ε ignored): the transfer experiment's plain comparator, written as plain.pt")


def run(args: MetaPretrainArgs) -> dict | None:
    """Build the tasks, meta-train, write the checkpoint and its card; returns the card (None on
    ranks other than 0, which write nothing)."""
    if args.real_weight <= 0:
        raise ValueError(f"--real-weight {args.real_weight}: give a positive factor (1: every task alike)")
    import pytorch_lightning as pl
    import torch
    import torch_geometric

    from gnn_policy.model import ModelConfig
    from gnn_policy.policy import save_checkpoint
    from gnn_policy.snapshot import SHIPPED
    from hardware_specs.features import GpuVocab
    from training.ddp import trainer_options
    from training.meta import ReptileConfig, ReptileModule
    from training.meta_data import MetaDataModule
    from training.objective import LossWeights
    from training.tracking import loggers

    start = time.time()
    pl.seed_everything(args.seed, workers=True)
    tasks, held, space_, fitted_on = _tasks(args)
    data_seconds = time.time() - start
    model_config = ModelConfig(hidden=args.hidden, layers=args.layers, gpu_names=tuple(t.gpu for t in tasks),
                               geometry=args.geometry, cost_model=args.cost_model, floored_bound=args.floored_bound)
    # θ + 1·(θ' − θ) = θ': with one optimiser kept across tasks, that is ordinary training
    reptile = ReptileConfig(inner_steps=args.inner_steps, inner_lr=args.inner_lr,
                            epsilon=1.0 if args.plain else args.epsilon,
                            epsilon_end=1.0 if args.plain else args.epsilon_end,
                            meta_steps=args.epochs * args.steps_per_epoch, fresh_inner=not args.plain)
    name = "plain" if args.plain else "meta"
    data = MetaDataModule(tasks, held, space_, GpuVocab(model_config.gpu_names), steps_per_epoch=args.steps_per_epoch,
                          inner_steps=args.inner_steps, batch_size=args.batch_size, seed=args.seed,
                          real_weight=args.real_weight)
    module = ReptileModule(model_config, reptile, LossWeights(temperature=args.temperature,
                                                              cost_listwise=args.cost_listwise,
                                                              imitation=args.imitation_weight))
    trainer = pl.Trainer(
        max_epochs=args.epochs, max_time={"minutes": args.max_minutes},
        **trainer_options(args.devices, task_parallel=True),
        logger=loggers(Path(args.log_dir), job_type="meta-pretrain", group=args.group, tags=args.tags,
                       config=dataclasses.asdict(args), wandb=args.wandb),
        enable_checkpointing=False, deterministic=True, log_every_n_steps=1, num_sanity_val_steps=0,
        inference_mode=False)  # validation adapts a copy of the weights, which needs gradients
    val_start = trainer.validate(module, datamodule=data, verbose=False)[0]
    train_start = time.time()
    trainer.fit(module, datamodule=data)
    train_seconds = time.time() - train_start
    train_metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
    val_end = trainer.validate(module, datamodule=data, verbose=False)[0]
    if not trainer.is_global_zero:
        return None
    out = Path(args.out)
    save_checkpoint(module.model, out / f"{name}.pt")
    card = {
        "checkpoint": f"{name}.pt", "job": "meta-pretrain", "args": dataclasses.asdict(args),
        "model_config": dataclasses.asdict(model_config),
        "algorithm": {"name": "plain multi-task" if args.plain else "reptile", "first_order": True,
                      **dataclasses.asdict(reptile), "tasks_per_meta_step": args.devices,
                      "inner_optimizer": "Adam, one throughout" if args.plain else "Adam, fresh for every task",
                      "loss_weights": dataclasses.asdict(module.weights)},
        "tasks": [t.card() for t in tasks], "hold_out": [h.gpu for h in held],
        "snapshot": sorted(p.name for p in SHIPPED.glob("*.jsonl.gz")),
        "simulator": {"analytic": args.analytic, "fitted_on": fitted_on},
        "validation": {"labels": "simulated", "support_problems": len(held[0].support),
                       "query_problems": len(held[0].query)},
        "metrics": {**_rounded(train_metrics), **_rounded(val_end),
                    **{f"{k}_at_start": v for k, v in _rounded(val_start).items()}},
        "meta_steps_run": trainer.global_step // args.inner_steps, "epochs_run": trainer.current_epoch,
        "data_seconds": round(data_seconds, 1), "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.time() - start, 1),
        "versions": {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
                     "pytorch_lightning": pl.__version__},
        "cpu_threads": torch.get_num_threads(),  # the wall times above depend on it
    }
    (out / f"{name}.card.json").write_text(json.dumps(card, indent=1) + "\n")
    return card


def _tasks(args: MetaPretrainArgs) -> tuple[list[Task], list[HeldOut], ConfigSpace, str | None]:
    """(tasks, held-out GPUs' validation data, config space, GPU the analytic model was fitted on)."""
    from gnn_policy.database import Database
    from gnn_policy.measure.simulator import fitted_gpus, load_fitted
    from gnn_policy.model import ModelConfig
    from gnn_policy.snapshot import load_shipped
    from gnn_policy.space import space
    from training.imported import load_demonstrations
    from training.tasks import Simulation, build_tasks, canonical, held_out, role_problems

    sim = Simulation(load_fitted(args.analytic), space(ModelConfig.space), args.configs, args.seed)
    fitted_on = fitted_gpus(args.analytic)
    held_gpus = set(fitted_on) & set(canonical(args.hold_out, "--hold-out"))
    if held_gpus:
        warnings.warn(f"{args.analytic} was fitted on {', '.join(sorted(held_gpus))}, which is held out: the "
                      "simulated labels of every "
                      "task carry its few coefficients, so the hold-out is not complete for the simulator")
    demos = load_demonstrations(args.imported, ModelConfig.space)[0] if args.imitation_weight > 0 else []
    with Database(args.db) as db:
        load_shipped(db)
        tasks = build_tasks(args.hold_out, args.simulate, sim,
                            role_problems("train", args.problems, args.random_problems, args.seed),
                            db if args.real else None, demos, named_weight=args.named_weight)
    held = held_out(args.hold_out, sim, role_problems("train", args.inner_steps * args.batch_size, 0, args.seed),
                    role_problems("val", args.val_problems, args.random_val_problems, args.seed))
    return tasks, held, sim.space, fitted_on


def _rounded(metrics: dict) -> dict[str, float]:
    return {k: round(float(v), 5) for k, v in sorted(metrics.items())}
