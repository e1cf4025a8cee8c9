"""Fit the calibration of a checkpoint's predicted TFLOP/s (`gnn_policy.calibration`) on real rows.

    python -m gnn_policy.benchmarks.calibrate --db /tmp/r.sqlite --checkpoint checkpoints/pretrained.pt

For every problem of the GPU with correct real rows, the cost head predicts the TFLOP/s of
the measured configs and the `--top` it predicts fastest are kept: the configs a user is shown
first, chosen by prediction, not by outcome. The fit uses the training role (the train
families and random-train, `graphs.classes.ROLES`) and is checked on every held-out split together
(`held_out`: the val and test roles, family and random, so a GPU measured on random shapes alone,
as the H100, is checked too) and on each alone (`by_split`: random-test is where a user's shapes are), in DESIGN's calibration figures: median |log(estimate / measured)| and the
share within 20%, raw, capped at the bound and calibrated, with the rows measured above the
bound (`measured_above_bound`: the launch floor must keep it at 0). Writes
`<checkpoint>.calibration.json`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hardware_specs
from graphs.classes import ROLES, split_of
from gnn_policy.calibration import Calibration, errors, fit, path_for, roofline_tflops
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig


def favourite_rows(policy: Policy, db: Database, gpu: hardware_specs.GpuSpec, top: int) -> list[dict]:
    """(split, predicted, measured, roof, bound) of the `top` measured configs the cost head
    likes best, per problem of a suite or random split: roof is the roofline of the work (the
    fit's base), bound the roofline with the launch floor (`gnn_policy.calibration`)."""
    space = policy.model.space
    rows = []
    for problem in db.problems(gpu.name):
        if (split := split_of(problem)) == "other":
            continue
        measured = {TileConfig.from_key(k): tf for k, tf in db.tflops(gpu.name, problem.key).items() if k != CUBLAS}
        configs = [c for c in measured if c in space]
        if not configs:
            continue
        with torch.no_grad():
            h, _ = policy.encode(problem, gpu)
            idx = torch.tensor([space.index(c) for c in configs])[None]
            predicted = policy.cost(h, problem, gpu, idx)[0].exp().tolist()
        roof, bound = roofline_tflops(problem, gpu, floor=False), roofline_tflops(problem, gpu)
        best = sorted(zip(predicted, configs), key=lambda x: -x[0])[:top]
        rows += [{"split": split, "predicted": p, "measured": measured[c], "roof": roof, "bound": bound}
                 for p, c in best]
    return rows


def report(rows: list[dict], gpu: str) -> dict:
    train = [r for r in rows if r["split"] in ROLES["train"]]
    held = [r for r in rows if r["split"] in ROLES["val"] + ROLES["test"]]
    if not train or not held:
        raise SystemExit(f"need rows of the training role ({', '.join(ROLES['train'])}) and of a held-out split "
                         f"({', '.join(ROLES['val'] + ROLES['test'])}) on {gpu}; got {len(train)} and {len(held)}")
    intercept, slope = fit([r["predicted"] for r in train], [r["measured"] for r in train], [r["roof"] for r in train])
    cal = Calibration(gpu, intercept, slope)

    def figures(part: list[dict]) -> dict:
        measured = [r["measured"] for r in part]
        capped = [min(r["predicted"], r["bound"]) for r in part]
        fitted = [cal.apply(r["predicted"], r["roof"], r["bound"]) for r in part]
        return {"raw": errors([r["predicted"] for r in part], measured), "capped_at_roofline": errors(capped, measured),
                "calibrated": errors(fitted, measured),
                "measured_above_bound": sum(r["measured"] > r["bound"] for r in part)}

    return {"intercept": round(intercept, 4), "slope": round(slope, 4),
            "train": figures(train), "held_out": figures(held),
            "by_split": {name: figures([r for r in rows if r["split"] == name])
                         for name in sorted({r["split"] for r in rows} - set(ROLES["train"]))}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    ap.add_argument("--gpu", default="h200", help="GPU spec names, separated by commas")
    ap.add_argument("--top", type=int, default=8, help="configs per problem, the cost head's favourites")
    ns = ap.parse_args(argv)
    policy = Policy.load(ns.checkpoint)
    out = {"checkpoint": ns.checkpoint.name, "top": ns.top, "gpus": {}}
    with Database(ns.db) as db:
        load_shipped(db)
        for name in ns.gpu.split(","):
            gpu = hardware_specs.load(name)
            out["gpus"][gpu.name] = report(favourite_rows(policy, db, gpu, ns.top), gpu.name)
    print(json.dumps(out, indent=1))
    path_for(ns.checkpoint).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
