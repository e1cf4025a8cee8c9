"""Fit the calibration of a checkpoint's predicted TFLOP/s (`gnn_policy.calibration`) on real rows.

    python -m gnn_policy.benchmarks.calibrate --db /tmp/r.sqlite --checkpoint checkpoints/pretrained.pt

For every problem of each `--gpu` with correct real rows, the policy's scores (`Policy.scores`:
an ensemble's vote included, what `tune` shows) predict the TFLOP/s of the measured configs
and the `--top` it predicts fastest are kept: the configs a user is shown first, chosen by
prediction, not by outcome. The fit (`gnn_policy.calibration_level`: a
line per GPU through its ceiling, and a level per problem shared by the GPUs) uses the training role (the train
families and random-train, `graphs.classes.ROLES`) and is checked on every held-out split
together (`held_out`: the val and test roles, family and random, so a GPU measured on random
shapes alone, as the H100, is checked too) and on each alone (`by_split`: random-test is where
a user's shapes are), in DESIGN's calibration figures: median |log(estimate / measured)| and
the share within 20%, raw, capped at the bound, with the GPU's line alone and calibrated, with
the rows measured above the bound (`measured_above_bound`: the launch floor must keep it at 0).
Writes `<checkpoint>.calibration.json` and prints the calibrated held-out figures.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hardware_specs
from graphs.classes import ROLES, split_of
from gnn_policy.args import at_least
from gnn_policy.calibration import Calibration, errors, fit, path_for, roofline_tflops
from gnn_policy.calibration_level import RIDGE, SHAPE_FIELDS, fit_ceiling, level_features
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig


def favourite_rows(policy: Policy, db: Database, gpu: hardware_specs.GpuSpec, top: int) -> list[dict]:
    """(gpu, split, predicted, measured, roof, bound, features) of the `top` measured configs the
    cost head likes best, per problem of a suite or random split: roof is the roofline of the
    work (the fit's base), bound the roofline with the launch floor (`gnn_policy.calibration`),
    features the problem's level features (`gnn_policy.calibration_level`)."""
    space = policy.model.space
    rows = []
    for problem in db.problems(gpu.name):
        if (split := split_of(problem)) == "other":
            continue
        measured = {TileConfig.from_key(k): tf for k, tf in db.tflops(gpu.name, problem.key).items() if k != CUBLAS}
        configs = [c for c in measured if c in space]
        if not configs:
            continue
        scores = policy.scores(problem, gpu)  # what `tune` shows, an ensemble's vote included
        predicted = scores.by_flat[torch.tensor([space.flat_index(c) for c in configs])].exp().tolist()
        roof, bound = roofline_tflops(problem, gpu, floor=False), roofline_tflops(problem, gpu)
        features = level_features(problem, gpu, scores.context.tolist())
        best = sorted([(p, c) for p, c in zip(predicted, configs) if p > 0], key=lambda x: -x[0])[:top]
        rows += [{"gpu": gpu.name, "split": split, "predicted": p, "measured": measured[c], "roof": roof,
                  "bound": bound, "features": features, "dtype": problem.dtype} for p, c in best]
    return rows


def report(rows: list[dict], ridge: float = RIDGE) -> dict:
    """The fit on every GPU's training rows (`calibration_level.fit_ceiling` with `ridge`) and,
    per GPU, its figures raw, capped, with its own line alone (`calibration.fit`, no level) and
    calibrated."""
    train = [r for r in rows if r["split"] in ROLES["train"]]
    for gpu in sorted({r["gpu"] for r in rows}):
        mine, held = [r for r in train if r["gpu"] == gpu], [r for r in rows if r["gpu"] == gpu and _held(r)]
        if not mine or not held:
            raise SystemExit(f"need rows of the training role ({', '.join(ROLES['train'])}) and of a held-out split "
                             f"({', '.join(ROLES['val'] + ROLES['test'])}) on {gpu}; got {len(mine)} and {len(held)}")
    lines, level, sharpness = fit_ceiling(train, ridge)
    weights, sharpness = tuple(round(w, 6) for w in level), round(sharpness, 4)
    out = {"level": {"fields": list(SHAPE_FIELDS) + ["context"], "ridge": ridge, "weights": list(weights),
                     "sharpness": sharpness}, "gpus": {}}
    for gpu, (intercept, slope, ceiling) in lines.items():
        intercept, slope, ceiling = round(intercept, 4), round(slope, 4), round(ceiling, 4)
        mine = [r for r in rows if r["gpu"] == gpu]
        own = [r for r in mine if r["split"] in ROLES["train"]]
        line = Calibration(gpu, *fit([r["predicted"] for r in own], [r["measured"] for r in own],
                                     [r["roof"] for r in own]))
        dtypes = tuple(sorted({r["dtype"] for r in own}))
        cal = Calibration(gpu, intercept, slope, weights, ceiling, sharpness, dtypes)

        def figures(part: list[dict]) -> dict:
            measured = [r["measured"] for r in part]
            return {"raw": errors([r["predicted"] for r in part], measured),
                    "capped_at_roofline": errors([min(r["predicted"], r["bound"]) for r in part], measured),
                    "line_alone": errors([line.apply(r["predicted"], r["roof"], r["bound"]) for r in part], measured),
                    "calibrated": errors([cal.apply(r["predicted"], r["roof"], r["bound"], r["features"])
                                          for r in part], measured),
                    "measured_above_bound": sum(r["measured"] > r["bound"] for r in part)}

        out["gpus"][gpu] = {"intercept": intercept, "slope": slope, "ceiling": ceiling, "dtypes": list(dtypes),
                            "train": figures(own), "held_out": figures([r for r in mine if _held(r)]),
                            "by_split": {name: figures([r for r in mine if r["split"] == name])
                                         for name in sorted({r["split"] for r in mine if _held(r)})}}
    return out


def _held(row: dict) -> bool:
    return row["split"] in ROLES["val"] + ROLES["test"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    ap.add_argument("--gpu", default="h200", help="GPU spec names, separated by commas")
    ap.add_argument("--top", type=int, default=8, help="configs per problem, the cost head's favourites")
    ap.add_argument("--ridge", type=at_least(0.0, float), default=RIDGE,
                    help="ridge on the standardised level features (choose it on the val splits)")
    ap.add_argument("--no-write", action="store_true", help="print the figures only (a scan of --ridge)")
    ns = ap.parse_args(argv)
    policy = Policy.load(ns.checkpoint)
    with Database(ns.db) as db:
        load_shipped(db)
        rows = [r for name in ns.gpu.split(",") for r in favourite_rows(policy, db, hardware_specs.load(name), ns.top)]
    out = {"checkpoint": ns.checkpoint.name, "top": ns.top, **report(rows, ns.ridge)}
    summary = {gpu: {part: fig["calibrated"] for part, fig in [("held_out", g["held_out"]), *g["by_split"].items()]}
               for gpu, g in out["gpus"].items()}
    print(json.dumps(summary, indent=1))
    if not ns.no_write:
        path_for(ns.checkpoint).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
