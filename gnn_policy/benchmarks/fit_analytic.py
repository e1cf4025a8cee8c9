"""Fit the analytic time model (`gnn_policy.measure.simulator`) on real measurements of one or
more GPUs and report how well it predicts: fitted on the training problems (the train families
and random-train, `graphs.classes.ROLES`), checked on the validation and test ones (and per
GPU); rows of other problems (a tuned shape, a captured layer) are in neither.

    python -m gnn_policy.benchmarks.fit_analytic --db /tmp/sim.sqlite --out checkpoints/analytic.json
    python -m gnn_policy.benchmarks.fit_analytic --db /tmp/sim.sqlite --gpu h200-sm16,h200-sm32,h200-sm64,h200-sm96 \
        --held-out-gpu h200

The second form leaves the full H200 out, for the transfer experiment that holds it out, and
reports how the fit predicts the H200's rows (every family): the `analytic` baseline there.

Error figures: median |log(predicted / measured time)| over correct Triton rows, and the
`analytic` baseline's quality, the measured TFLOP/s of the config the model ranks first among
those measured, over the best measured (geomean over problems).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import hardware_specs
from graphs.classes import ROLES, split_of
from gnn_policy.database import Database
from gnn_policy.db_schema import problem_from_fields
from gnn_policy.measure.result import CUBLAS
from gnn_policy.measure.simulator import AnalyticModel, fit
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig


def evaluate(model: AnalyticModel, data: list) -> dict:
    if not data:  # e.g. a slice measured on train problems only
        return {"rows": 0, "problems": 0}
    pred = model.predict_ms([d[:3] for d in data]).tolist()
    by_problem = defaultdict(list)
    for p, d in zip(pred, data):
        by_problem[d[0].key].append((p, d[3]))
    picked = [min(v)[1] for v in by_problem.values()]
    best = [min(t for _, t in v) for v in by_problem.values()]
    return {"rows": len(data), "problems": len(by_problem),
            "median_abs_log_error": round(statistics.median(abs(math.log(p / d[3])) for p, d in zip(pred, data)), 3),
            "top1_of_measured": round(math.exp(statistics.fmean(math.log(b / t) for b, t in zip(best, picked))), 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--gpu", default="H200-SXM-141GB", help="GPU spec name, or several separated by commas")
    ap.add_argument("--held-out-gpu", default="", help="a GPU not fitted on whose rows the fit is also checked on")
    ap.add_argument("--out", type=Path, help="write the fitted coefficients and the figures here (JSON)")
    ns = ap.parse_args(argv)
    gpus = {g.name: g for g in (hardware_specs.load(n) for n in ns.gpu.split(","))}
    other = hardware_specs.load(ns.held_out_gpu) if ns.held_out_gpu else None
    if other and other.name in gpus:
        raise SystemExit(f"--held-out-gpu {other.name} is also in --gpu")
    known = {**gpus, **({other.name: other} if other else {})}
    with Database(ns.db) as db:
        load_shipped(db)
        rows = [r for r in db.rows_after(0) if r["gpu"] in known and r["source"] == "real"
                and r["status"] == "ok" and r["config"] != CUBLAS]
    missing = set(known) - {r["gpu"] for r in rows}
    if missing:
        raise SystemExit(f"no correct real Triton rows for {', '.join(sorted(missing))} in {ns.db}")
    every = [(problem_from_fields(r["problem_fields"]), TileConfig.from_key(r["config"]), known[r["gpu"]],
              r["median_ms"]) for r in rows]
    data = [d for d in every if d[2].name in gpus]
    train = [d for d in data if split_of(d[0]) in ROLES["train"]]
    held_out = [d for d in data if split_of(d[0]) in ROLES["val"] + ROLES["test"]]
    model = fit([d[:3] for d in train], [d[3] for d in train])
    report = {"gpus": sorted(gpus), "coefficients": dataclasses.asdict(model),
              "train": evaluate(model, train), "val_and_test": evaluate(model, held_out)}
    if len(gpus) > 1:
        for name, part in (("train", train), ("val_and_test", held_out)):
            report[f"per_gpu_{name}"] = {g: evaluate(model, [d for d in part if d[2].name == g]) for g in sorted(gpus)}
    if other:
        report["held_out_gpu"] = {"gpu": other.name, **evaluate(model, [d for d in every if d[2].name == other.name])}
    print(json.dumps(report, indent=1))
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
