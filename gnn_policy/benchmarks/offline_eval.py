"""Pickers judged on replayed real labels (CPU): each orders the configs measured for a problem.

    python -m gnn_policy.benchmarks.offline_eval --db /tmp/r.sqlite --splits val,test \\
        --checkpoint new.pt --old checkpoints/pretrained.pt --out policy_offline.json

For each problem of a family split with real rows on the GPU, the candidates are its measured
configs that are valid for it in the policy's space (about 320 a problem: a stratified random
sample plus the named lists; more where a dense sweep ran). Every picker orders them, and its
figure at k is the best measured TFLOP/s of its first k over best known (the best measured
config of the problem, any space), geomean over problems, per split and per class:
- `new`: a bounded checkpoint's scores, then `diverse_order` (its `top_k` rule on these candidates);
- `new_by_score`: the same scores without the diversity rule; `new_heads`: its autoregressive heads;
- `old`: a first-generation checkpoint's rule (`first_pick` on probability and cost, then probability);
- `analytic`: the fitted analytic model's predictions (checkpoints/analytic.json);
- `default`: `default_config` as `gnn_policy.matmul` runs it, where it was measured (else left out;
  every picker is also reported on those problems alone);
- `random`: a seeded random order.
Calibration of the bounded model: median |log(predicted / measured)| and the share within 20%
on all candidates and on the 8 it predicts fastest; the largest predicted / roofline over every
valid config (the roofline of the work, the cost head's own bound, without the launch floor). Distribution: cross-entropy of the listwise target (softmax of
log(TFLOP/s / best) / 0.1 over the candidates) under the cost model's softmax at several
temperatures and under the heads. Several `--checkpoint`s: the same figures for each (ablations).
"""
from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Callable, Sequence

import torch

import hardware_specs
from graphs.classes import CLASSES, classes, split_of
from gnn_policy.baselines import default_pick, fits
from gnn_policy.benchmarks.data_report import geomean
from gnn_policy.calibration import errors, roofline_tflops
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.measure.simulator import load_fitted
from gnn_policy.policy import Policy, diverse_order, diversity_group, first_pick
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig

KS = (1, 2, 4, 8)
DEFAULT_MEASURED = "where default_config was measured"
TEMPERATURES = (0.03, 0.1, 0.3, 1.0)
# the diversity groups compared on val (policy.diversity_group is the one kept)
GROUPS: dict[str, Callable[[TileConfig], tuple]] = {
    "variant,split_k,bm,bn,bk": diversity_group,
    "variant,split_k,bm,bn": lambda c: (c.variant, c.split_k, c.block_m, c.block_n),
    "variant,split_k>1,bm,bn": lambda c: (c.variant, c.split_k > 1, c.block_m, c.block_n),
    "variant,split_k": lambda c: (c.variant, c.split_k),
}


def bounded_orders(policy: Policy, p, gpu, configs: list[TileConfig], values: list[float]) -> tuple[dict, dict]:
    """(orders by picker name, figures) of a bounded checkpoint on one problem's candidates."""
    s = policy.scores(p, gpu)
    pred = s.by_flat[torch.tensor([policy.model.space.flat_index(c) for c in configs])]
    by_score = pred.argsort(descending=True).tolist()
    ranked = [configs[i] for i in by_score]
    orders = {"new_by_score": by_score}
    for name, group in GROUPS.items():
        orders[f"new[{name}]"] = [by_score[i] for i in diverse_order(ranked, len(ranked), group)]
    orders["new"] = orders[f"new[{next(iter(GROUPS))}]"]
    h, mask = policy.encode(p, gpu)
    with torch.no_grad():
        idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
        heads = policy.model.log_prob(h, idx, mask)[0]
    orders["new_heads"] = heads.argsort(descending=True).tolist()
    measured = torch.tensor(values, dtype=torch.float64)
    target = torch.softmax(measured.log() / 0.1, 0)
    valid_pred = s.by_flat[torch.isfinite(s.by_flat)].double()
    ce = {f"cost_T={t:g}": -(target * (pred.double() / t - torch.logsumexp(valid_pred / t, 0))).sum().item()
          for t in TEMPERATURES}
    ce["heads"] = -(target * heads.double()).sum().item()
    top = by_score[:8]
    figures = {"pred": [math.exp(pred[i].item()) for i in range(len(configs))], "top8": top, "ce": ce,
               "max_over_roof": math.exp(s.log_tflops[0].item()) / roofline_tflops(p, gpu, floor=False)}
    return orders, figures


def old_order(policy: Policy, p, gpu, configs: list[TileConfig]) -> list[int]:
    """The first checkpoints' rule (`Policy.top_k` for cost_model 0) on these candidates."""
    with torch.no_grad():
        h, mask = policy.encode(p, gpu)
        idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
        logp, cost = policy.model.log_prob(h, idx, mask)[0], policy.cost(h, p, gpu, idx)[0]
    order = logp.argsort(descending=True).tolist()
    first = first_pick([logp[i].item() for i in order], [cost[i].item() for i in order])
    return [order[first]] + [i for j, i in enumerate(order) if j != first]


def evaluate(db: Database, gpu, split: str, new: dict[str, Policy], old: Policy | None, analytic, seed: int) -> dict:
    """Per picker, per class ('all' too): geomean fraction of best known at each k; calibration."""
    fractions: dict[str, dict[str, dict[int, list[float]]]] = {}
    calib: dict[str, dict[str, list]] = {name: {"pred": [], "meas": [], "pred8": [], "meas8": [], "roof": []}
                                         for name in new}
    ce: dict[str, dict[str, list[float]]] = {name: {} for name in new}
    problems = [p for p in db.problems(gpu.name) if split_of(p) == split]
    default_measured = 0
    for p in problems:
        tf = db.tflops(gpu.name, p.key)
        tf.pop(CUBLAS, None)
        best = max(tf.values())
        space_ = next(iter(new.values())).model.space
        ok = fits(space_, gpu, p)
        configs = [c for c in map(TileConfig.from_key, tf) if c in space_ and ok(c)]
        values = [tf[c.key] for c in configs]
        orders: dict[str, list[int]] = {}
        for name, policy in new.items():
            o, fig = bounded_orders(policy, p, gpu, configs, values)
            orders.update({(k if len(new) == 1 else f"{name}:{k}"): v for k, v in o.items()})
            cal = calib[name]
            cal["pred"] += fig["pred"]
            cal["meas"] += values
            cal["pred8"] += [fig["pred"][i] for i in fig["top8"]]
            cal["meas8"] += [values[i] for i in fig["top8"]]
            cal["roof"].append(fig["max_over_roof"])
            for key, v in fig["ce"].items():
                ce[name].setdefault(key, []).append(v)
        if old is not None:
            orders["old"] = old_order(old, p, gpu, configs)
        scores = analytic.predict_tflops(p, configs, gpu)
        orders["analytic"] = sorted(range(len(configs)), key=lambda i: -scores[i])
        rng = random.Random(f"{seed}:{p.key}")
        orders["random"] = rng.sample(range(len(configs)), len(configs))
        default = default_pick(p, gpu, ok)
        # the problems where default_config was measured form a group of their own: every picker on them
        groups = ("all", *classes(p)) + ((DEFAULT_MEASURED,) if default.key in tf else ())
        for name, order in orders.items():
            for k in KS:
                frac = max(values[i] for i in order[:k]) / best
                for g in groups:
                    fractions.setdefault(name, {}).setdefault(g, {}).setdefault(k, []).append(frac)
        if default.key in tf:
            default_measured += 1
            for g in groups:
                for k in KS:
                    fractions.setdefault("default", {}).setdefault(g, {}).setdefault(k, []).append(tf[default.key] / best)
    out = {"split": split, "problems": len(problems), "default_measured_on": default_measured,
           "fraction_of_best_known": {
               name: {g: {"problems": len(by_k[1]), **{str(k): round(geomean(v), 4) for k, v in by_k.items()}}
                      for g, by_k in sorted(per.items(), key=lambda x: (x[0] != "all", _class_rank(x[0])))}
               for name, per in fractions.items()},
           "calibration": {name: {
               "all_candidates": errors(c["pred"], c["meas"]), "top8_predicted": errors(c["pred8"], c["meas8"]),
               "max_predicted_over_roofline": round(max(c["roof"]), 4)} for name, c in calib.items()},
           "cross_entropy_of_listwise_target": {name: {k: round(sum(v) / len(v), 3) for k, v in per.items()}
                                                for name, per in ce.items()}}
    return out


def markdown(result: dict, pickers: Sequence[str]) -> str:
    """Tables of one `evaluate` result per split: a row per (picker, class), a column per k."""
    lines = []
    for split, r in result.items():
        lines += [f"{split} ({r['problems']} problems; default_config measured on {r['default_measured_on']}):", "",
                  "| picker | class | problems | " + " | ".join(f"k={k}" for k in KS) + " |",
                  "|---|---|---:|" + "---:|" * len(KS)]
        classes_ = list(next(iter(r["fraction_of_best_known"].values())))
        for g in classes_:
            for name in pickers:
                row = r["fraction_of_best_known"].get(name, {}).get(g)
                if row:
                    lines.append(f"| {name} | {g} | {row['problems']} | " + " | ".join(f"{row[str(k)]:.3f}" for k in KS)
                                 + " |")
        lines.append("")
    return "\n".join(lines)


def _class_rank(name: str) -> int:
    return CLASSES.index(name) if name in CLASSES else len(CLASSES)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--splits", default="val,test", help="family splits, separated by commas")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--checkpoint", action="append", required=True,
                    help="a bounded checkpoint (cost_model 1); repeat to compare several (NAME=PATH names it)")
    ap.add_argument("--old", default="", help="a first-generation checkpoint (cost_model 0) to compare with")
    ap.add_argument("--analytic", default=str(Path(__file__).resolve().parents[2] / "checkpoints" / "analytic.json"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the JSON here")
    ap.add_argument("--markdown", default="", help="also write tables of these pickers (comma-separated) here, "
                                                   "with --markdown-pickers")
    ap.add_argument("--markdown-pickers", default="new,old,analytic,default,random")
    ns = ap.parse_args(argv)
    gpu = hardware_specs.load(ns.gpu)
    new = {}
    for item in ns.checkpoint:
        name, _, path = item.rpartition("=")
        new[name or Path(path).stem] = Policy.load(path)
    old = Policy.load(ns.old) if ns.old else None
    analytic = load_fitted(ns.analytic)
    with Database(ns.db) as db:
        load_shipped(db)
        result = {s: evaluate(db, gpu, s, new, old, analytic, ns.seed) for s in ns.splits.split(",")}
    text = json.dumps(result, indent=1)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    if ns.markdown:
        Path(ns.markdown).write_text(markdown(result, ns.markdown_pickers.split(",")))
    print(text)


if __name__ == "__main__":
    main()
