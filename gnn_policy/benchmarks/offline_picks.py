"""The policy's picks judged on stored measurements alone (CPU): no GPU, so no new configs.

    python -m gnn_policy.benchmarks.offline_picks --db /tmp/r.sqlite --split val

For each measured problem of the split, the measured configs are ranked two ways:
- `policy`: by probability (cost_model 1: by predicted TFLOP/s, whose softmax it is);
- `first pick rule`: the rule of `Policy.top_k` (`policy.first_pick`) applied to them, then
  the others by probability.
top-1 is the first config's TFLOP/s over best known, best-of-8 the best of the first 8
(geomean over problems); the rule's top-1 is also given by problem size, and with
`--sweep-rule` under other values of its two constants. With `--global-picks`, `Policy.top_k`'s own 8 picks over the whole
space are also looked up; a pick never measured is counted as missing, not scored. The
choices of the rule (RERANK, COST_WEIGHT) were made on the val split; the test split is for
reporting only.
"""
from __future__ import annotations

import argparse
import json

import torch

import hardware_specs
from graphs.classes import ALL_SPLITS, split_of
from gnn_policy.benchmarks.data_report import SIZE_GROUPS, geomean
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy, first_pick
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import TileConfig


RULE_GRID = ((4, 8, 16, 32, 64), (0.0, 1.0, 3.0, 10.0, 30.0, 100.0))  # RERANK x COST_WEIGHT for --sweep-rule


def evaluate(db: Database, policy: Policy, gpu, split: str, global_picks: bool, sweep_rule: bool = False) -> dict:
    space_ = policy.model.space
    scores: dict[str, list[float]] = {k: [] for k in ("policy_top1", "policy_best_of_8", "rule_top1", "rule_best_of_8")}
    found = {"top1_measured": 0, "picks_measured": 0, "top1": [], "best_of_8": []}
    groups: dict[str, list[float]] = {name: [] for name in SIZE_GROUPS}
    ranked = []  # per problem: log probabilities, predicted log TFLOP/s and values, most probable first
    problems = [p for p in db.problems(gpu.name) if split_of(p) == split]
    for p in problems:
        tf = db.tflops(gpu.name, p.key)
        tf.pop(CUBLAS, None)
        best = max(tf.values())
        configs = [c for c in map(TileConfig.from_key, tf) if c in space_]
        idx = torch.tensor([space_.index(c) for c in configs])[None]
        with torch.no_grad():
            h, mask = policy.encode(p, gpu)
            cost = policy.cost(h, p, gpu, idx)[0]
            # cost_model 1's distribution is the cost model's softmax: its heads do not rank
            logp = cost if policy.model.cfg.cost_model == 1 else policy.model.log_prob(h, idx, mask)[0]
        order = logp.argsort(descending=True).tolist()
        value = [tf[configs[i].key] / best for i in order]
        ranked.append(([logp[i].item() for i in order], [cost[i].item() for i in order], value))
        first = first_pick(*ranked[-1][:2])
        rule = [value[first]] + [v for j, v in enumerate(value) if j != first]
        scores["policy_top1"].append(value[0])
        scores["policy_best_of_8"].append(max(value[:8]))
        scores["rule_top1"].append(rule[0])
        for name, holds in SIZE_GROUPS.items():
            if holds(p):
                groups[name].append(rule[0])
        scores["rule_best_of_8"].append(max(rule[:8]))
        if global_picks:
            picks = [tf.get(x.config.key) for x in policy.top_k(p, gpu, 8)]
            found["top1_measured"] += picks[0] is not None
            found["picks_measured"] += sum(v is not None for v in picks)
            if picks[0] is not None:
                found["top1"].append(picks[0] / best)
            if any(v is not None for v in picks):
                found["best_of_8"].append(max(v for v in picks if v is not None) / best)
    out = {"split": split, "problems": len(problems), **{k: round(geomean(v), 3) for k, v in scores.items()},
           "rule_top1_by_size": {k: {"problems": len(v), "top1": round(geomean(v), 3)} for k, v in groups.items() if v}}
    if sweep_rule:
        out["rule_sweep_top1"] = {f"rerank={r}": {f"cost_weight={w:g}": round(geomean(
            [v[first_pick(lp, c, r, w)] for lp, c, v in ranked]), 3) for w in RULE_GRID[1]} for r in RULE_GRID[0]}
    if global_picks:
        out["global_picks"] = {"top1_measured": found["top1_measured"], "picks_measured": found["picks_measured"],
                               "picks": 8 * len(problems), "top1_where_measured": round(geomean(found["top1"]), 3),
                               "best_of_8_where_measured": round(geomean(found["best_of_8"]), 3)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--split", default="val", choices=[s for s in ALL_SPLITS if s != "other"])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    ap.add_argument("--global-picks", action="store_true", help="also look up top_k's own 8 picks")
    ap.add_argument("--sweep-rule", action="store_true",
                    help="also the first pick's top-1 under other RERANK and COST_WEIGHT values (on val)")
    ns = ap.parse_args(argv)
    gpu = hardware_specs.load(ns.gpu)
    with Database(ns.db) as db:
        load_shipped(db)
        print(json.dumps(evaluate(db, Policy.load(ns.checkpoint), gpu, ns.split, ns.global_picks, ns.sweep_rule), indent=1))


if __name__ == "__main__":
    main()
