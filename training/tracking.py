"""The one place experiment tracking is set up: W&B (offline unless WANDB_MODE says otherwise)
and a local CSV of the same metrics."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence


def _offline_by_default() -> None:
    os.environ.setdefault("WANDB_MODE", "offline")  # no machine here reaches W&B; `wandb sync` later
    os.environ.setdefault("WANDB_SILENT", "true")


def loggers(save_dir: Path, *, job_type: str, group: str, tags: Sequence[str], config: dict,
            wandb: bool = True) -> list:
    """[CSVLogger, WandbLogger] for a Lightning job: metrics land in save_dir/csv/<start time>-<pid>
    and save_dir/wandb/offline-run-*."""
    from pytorch_lightning.loggers import CSVLogger

    save_dir.mkdir(parents=True, exist_ok=True)
    # named, not numbered: two jobs started together in one folder both took version_0, and the
    # second one's first epoch died in the CSV writer
    version = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    out = [CSVLogger(str(save_dir), name="csv", version=version)]
    if wandb:
        from pytorch_lightning.loggers import WandbLogger

        _offline_by_default()
        out.append(WandbLogger(project="gnn-policy", save_dir=str(save_dir), job_type=job_type, group=group,
                               tags=list(tags), config=config, offline=os.environ["WANDB_MODE"] == "offline"))
    return out


def wandb_run(save_dir: Path, *, job_type: str, group: str, tags: Sequence[str], config: dict,
              run_id: str | None = None):
    """A W&B run for a job without a Trainer (bench): same project, offline by default. A
    `run_id` names the run, so logging it again updates that run instead of adding one."""
    _offline_by_default()
    import wandb

    save_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(project="gnn-policy", job_type=job_type, group=group, tags=list(tags), config=config,
                      dir=str(save_dir), id=run_id, resume="allow" if run_id else None)
