"""`gnn-policy pretrain`: train the policy on real measurements of the training problems.

Training problems are the train families' and random-train's, validation (the logged val/
figures) the val families' and random-val's (`graphs.classes.ROLES`); no test problem of
either kind is read for training or validation.

With `--imitation-weight` above 0 the policy also imitates the imported vLLM / SGLang configs
(`training.imported`) of the train families; their GPUs get learned embeddings too.

Writes `<out>/pretrained.pt` (the model's state_dict and its ModelConfig, loadable with
`torch.load(weights_only=True)`) and `<out>/pretrained.card.json` (data, GPUs, splits,
metrics, versions). Metrics go to W&B (offline by default) and to a CSV under `--log-dir`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path

from gnn_policy.args import at_least, flag, one_of, positive
from gnn_policy.database import DEFAULT_PATH
from training.imported import TUNED_CONFIGS, load_demonstrations


def cost_model_flag(text: str) -> int:
    """0 or 1 (`ModelConfig.cost_model`)."""
    value = at_least(0)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be 0 or 1, got {text}")
    return value


def ema_decay_flag(text: str) -> float:
    """--ema-decay: 0 (no average) or a decay below 1."""
    value = at_least(0, float)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1 (0: no average), got {text}")
    return value


def share_flag(text: str) -> float:
    """--train-share, --train-config-share: a share in (0, 1]."""
    value = positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be at most 1 (a share), got {text}")
    return value


@dataclasses.dataclass(frozen=True)
class PretrainArgs:
    """Pretrain the policy on the measurement database (train families + random-train; val families + random-val)."""

    db: str = flag(str(DEFAULT_PATH), "the SQLite database; the shipped snapshot is loaded into it first")
    config: str = flag("", "a JSON file of these fields; flags given on the command line override it")
    gpus: tuple[str, ...] = flag(("H200-SXM-141GB",), "GPUs whose real measurements to train on (repeatable)",
                                 action="append")
    epochs: int = flag(200, "passes over the training problems", check=at_least(1))
    batch_size: int = flag(8, "problems per batch", check=at_least(1))
    lr: float = flag(1e-3, "AdamW learning rate", check=positive)
    hidden: int = flag(128, "width of the encoders and heads", check=at_least(1))
    layers: int = flag(3, "GINEConv layers", check=at_least(1))
    geometry: bool = flag(True, "feed the cost head the tile geometry (waves, padding, K steps; --cost-model 0)",
                          off="the cost head reads no tile geometry (as the first checkpoints)")
    cost_model: int = flag(1, "1: roofline-bounded cost head reading the analytic features, whose scores "
                              "pick from every valid config; 0: the first checkpoints' unbounded head",
                           check=cost_model_flag)
    cost_features: bool = flag(True, "the bounded cost head reads the analytic features",
                               off="the bounded cost head reads the encodings and knobs alone (an ablation)")
    encoder: str = flag("gnn", "problem encoder: gnn (GINEConv message passing) or mlp (the same node "
                               "features, no messages; an ablation)", check=one_of("gnn", "mlp"))
    space: str = flag("full", "config space the policy ranks (gnn_policy.space.SPACES): full (ptr and tma, the "
                              "shipped checkpoints'), hopper (adds persistent and warpspec), hopper-tested (the "
                              "variants that passed the GPU suite) or hopper-all (every variant)",
                      check=one_of("full", "hopper", "hopper-all", "hopper-tested"))
    floored_bound: bool = flag(False, "the bounded cost head's bound and roofline feature include the GPU's launch "
                                      "floor (calibration.roofline_us); off: the work alone, as the shipped checkpoints")
    regression_weight: float = flag(0.1, "weight of the cost head's squared error on log TFLOP/s, beside its "
                                         "ranking loss", check=at_least(0, float))
    cost_listwise: float = flag(3.0, "weight of the cost head's listwise loss: softmax(predicted log TFLOP/s / "
                                     "--temperature) against the listwise target (the policy's distribution; "
                                     "docs/BENCHMARKS.md, 'The bounded cost model', chose 3 on val)", check=at_least(0, float))
    named_weight: float = flag(0.25, "weight of the rows of the named lists in the targets and losses: they "
                                     "are measured on every problem (1: as any row)", check=positive)
    temperature: float = flag(0.1, "listwise target temperature on log(TFLOP/s / best)", check=positive)
    ema_decay: float = flag(0.0, "decay of an exponential moving average of the weights, validated and "
                                 "written in their place (0: none; 0.999 averages over about 1,000 steps)",
                            check=ema_decay_flag)
    train_share: float = flag(1.0, "share of the training problems kept, chosen by a stable hash of the problem "
                                   "(a learning curve; 1: all)", check=share_flag)
    train_config_share: float = flag(1.0, "share of each training problem's measured configs kept, chosen by a "
                                          "stable hash (against --train-share: fewer configs on more problems; "
                                          "1: all)", check=share_flag)
    train_on_val: bool = flag(False, "also train on the val problems: the final retrain of a recipe chosen on val "
                                     "(the logged val figures are then training figures)")
    seed: int = flag(0, "seed of weights, shuffling and GPU-embedding dropout")
    out: str = flag("checkpoints", "folder for pretrained.pt and pretrained.card.json")
    log_dir: str = flag("runs/pretrain", "folder for the CSV metrics and the offline W&B run")
    group: str = flag("pretrain", "W&B group")
    tags: tuple[str, ...] = flag((), "W&B tags (repeatable)", action="append")
    wandb: bool = flag(True, "log to W&B (offline unless WANDB_MODE is set)", off="write no W&B run")
    max_minutes: float = flag(20.0, "stop training after this many minutes", check=positive)
    imitation_weight: float = flag(0.0, "weight of the imitation loss on imported vLLM / SGLang configs (0: off)",
                                   check=at_least(0, float))
    imported: str = flag(str(TUNED_CONFIGS), "folder of the imported tuned configs (with --imitation-weight)")
    devices: int = flag(1, "processes to train in, one per GPU (Lightning DDP; without a GPU, CPU processes "
                           "with gloo); --batch-size is split over them, and rank 0 writes the outputs")


def run(args: PretrainArgs) -> dict | None:
    """Train, write the checkpoint and its card; returns the card (None on ranks other than 0,
    which write nothing)."""
    if args.batch_size % args.devices:
        raise ValueError(f"--batch-size {args.batch_size} cannot be split evenly over --devices {args.devices}")
    import pytorch_lightning as pl
    import torch
    import torch_geometric

    from hardware_specs.features import GpuVocab
    from graphs.classes import ROLES, split_of
    from graphs.suite import SPLITS
    from gnn_policy.model import ModelConfig
    from gnn_policy.policy import save_checkpoint
    from gnn_policy.snapshot import SHIPPED
    from gnn_policy.space import space
    from training.datamodule import MeasurementDataModule
    from training.ddp import trainer_options
    from training.module import PolicyModule
    from training.tracking import loggers

    pl.seed_everything(args.seed, workers=True)
    demos = load_demonstrations(args.imported, args.space)[0] if args.imitation_weight > 0 else []
    gpu_names = tuple(sorted({*args.gpus, *(d.gpu for d in demos)}))
    model_config = ModelConfig(hidden=args.hidden, layers=args.layers, gpu_names=gpu_names, geometry=args.geometry,
                               cost_model=args.cost_model, cost_features=args.cost_features, encoder=args.encoder,
                               floored_bound=args.floored_bound, space=args.space)
    data = MeasurementDataModule(args.db, args.gpus, space(model_config.space), GpuVocab(model_config.gpu_names),
                                 batch_size=args.batch_size // args.devices, demos=demos,
                                 named_weight=args.named_weight, train_share=args.train_share,
                                 train_config_share=args.train_config_share,
                                 train_on_val=args.train_on_val)
    module = PolicyModule(model_config, lr=args.lr, temperature=args.temperature,
                          regression_weight=args.regression_weight, cost_listwise_weight=args.cost_listwise,
                          imitation_weight=args.imitation_weight, ema_decay=args.ema_decay)
    trainer = pl.Trainer(
        max_epochs=args.epochs, max_time={"minutes": args.max_minutes}, **trainer_options(args.devices),
        logger=loggers(Path(args.log_dir), job_type="pretrain", group=args.group, tags=args.tags,
                       config=dataclasses.asdict(args), wandb=args.wandb),
        enable_checkpointing=False, deterministic=True, log_every_n_steps=1)
    start = time.time()
    trainer.fit(module, datamodule=data)
    if not trainer.is_global_zero:
        return None
    out = Path(args.out)
    save_checkpoint(module.shipped, out / "pretrained.pt")
    card = {
        "checkpoint": "pretrained.pt", "job": "pretrain", "args": dataclasses.asdict(args),
        "model_config": dataclasses.asdict(model_config), "gpus": list(args.gpus),
        "data": {role: {"problems": len(s), "measured_configs": sum(len(x.configs) for x in s),
                        "problems_by_split": dict(Counter(split_of(x.problem) for x in s))}
                 for role, s in data.samples.items()},
        "snapshot": sorted(p.name for p in SHIPPED.glob("*.jsonl.gz")),
        "splits": {name: list(families) for name, families in SPLITS.items()},
        "roles": {role: list(splits) for role, splits in ROLES.items()},  # what "data" counts under each key
        "metrics": {k: round(float(v), 5) for k, v in sorted(trainer.callback_metrics.items())},
        "epochs_run": trainer.current_epoch, "train_seconds": round(time.time() - start, 1),
        "versions": {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
                     "pytorch_lightning": pl.__version__},
    }
    if data.imported:
        card["imported"] = {"problems": len(data.imported), "gpus": sorted({x.gpu for x in data.imported}),
                            "demonstrations": sum(len(x.configs) for x in data.imported)}
    (out / "pretrained.card.json").write_text(json.dumps(card, indent=1) + "\n")
    return card
