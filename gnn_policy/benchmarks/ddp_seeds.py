"""Seeded pretraining in one process against N processes (Lightning DDP), on a synthetic database.

    python -m gnn_policy.benchmarks.ddp_seeds --work /tmp/ddp-seeds --devices 1,2 --seeds 0,1,2,3,4

The database holds made-up TFLOP/s (bigger tiles faster, split-K helping small M, a few
percent of noise) for 32 train-family and 8 val-family bf16 problems, 24 configs each, so the
comparison needs neither a GPU nor the shipped snapshot. Each (devices, seed) run is a
`gnn-policy pretrain` in its own folder of `--work` (an existing card is reused); one line per
run gives its final metrics, then the N-process minus one-process differences per seed beside
the seed-to-seed standard deviation of one process: the noise the difference is judged by.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import hardware_specs
from graphs.suite import split
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.space import space, violations

METRICS = ("train/loss", "val/loss", "val/top1_measured")
TRAIN = ("--epochs", "40", "--batch-size", "8", "--hidden", "32", "--layers", "2", "--no-wandb")


def synthetic_db(path: Path) -> None:
    """The made-up measurements (once: an existing file is kept)."""
    if path.exists():
        return
    gpu, rng = hardware_specs.load("h200"), random.Random(0)
    valid = [c for c in space("full") if not violations(c, gpu, "bf16")]
    problems = ([p for p in split("train") if p.dtype == "bf16"][:32] +
                [p for p in split("val") if p.dtype == "bf16"][:8])
    with Database(path) as db:
        for p in problems:
            rows = []
            for c in rng.sample(valid, 24):
                speed = 100 * math.log2(c.block_m * c.block_n) / 16 * (1 + 0.3 * (c.split_k > 1) * (p.m <= 64))
                rows.append((Measurement(gpu.name, p.key, c.key, "ok", median_ms=1.0, tflops=speed + 5 * rng.random()),
                             p, c))
            db.add(rows)


def pretrain(work: Path, devices: int, seed: int) -> dict:
    """The card of one run (trained now unless its folder has one)."""
    out = work / f"devices{devices}-seed{seed}"
    if not (out / "pretrained.card.json").exists():
        subprocess.run([sys.executable, "-m", "gnn_policy.cli", "pretrain", "--db", str(work / "m.sqlite"), *TRAIN,
                        "--seed", str(seed), "--devices", str(devices), "--out", str(out),
                        "--log-dir", str(out / "runs")], check=True, capture_output=True)
    return json.loads((out / "pretrained.card.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="folder for the database and the runs")
    parser.add_argument("--devices", default="1,2", help="process counts; the first is the reference")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    synthetic_db(work / "m.sqlite")
    devices, seeds = [int(d) for d in args.devices.split(",")], [int(s) for s in args.seeds.split(",")]
    final = {}
    for d in devices:
        for s in seeds:
            card = pretrain(work, d, s)
            final[d, s] = card["metrics"]
            print(f"devices {d} seed {s}: " + ", ".join(f"{m} {card['metrics'][m]:.4f}" for m in METRICS), flush=True)
    for m in METRICS:
        noise = statistics.stdev(final[devices[0], s][m] for s in seeds) if len(seeds) > 1 else float("nan")
        for d in devices[1:]:
            diffs = [final[d, s][m] - final[devices[0], s][m] for s in seeds]
            print(f"{m}: {d} - {devices[0]} processes per seed {', '.join(f'{x:+.4f}' for x in diffs)}; "
                  f"mean |diff| {statistics.mean(map(abs, diffs)):.4f}; seed sd of {devices[0]} process(es) {noise:.4f}")


if __name__ == "__main__":
    main()
