"""The fine-tune's guard judged on replayed real labels (CPU): does it keep the adaptations that help?

    python -m training.guard_replay --db /tmp/all.sqlite --out docs/data/guard/h200-val.json

For each checkpoint, budget and seed, `finetune --replay --no-guard` adapts on the real rows
of --gpu that --db holds, and `offline_picks` scores the adapted weights and the start on
--split (first pick among the measured configs, and best of 8; geomean over problems). The
cross-fit (`training.guard.cross_fit`) is then asked, on the run's own measurements
and for each --folds, whether it would have kept the adapted weights. A guarded run scores
what the weights it keeps score, so its figure follows from the two without a second run.
A decision is wrong where it keeps weights that pick worse than the start, or drops ones
that pick better. Prints a table and writes every run's figures to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

import hardware_specs
from graphs import GemmProblem
from gnn_policy.benchmarks.offline_picks import evaluate
from gnn_policy.database import Database
from gnn_policy.policy import Policy
from gnn_policy.snapshot import load_shipped
from training.guard import cross_fit
from training.finetune import FinetuneArgs, run


def replay_run(db_path: str, gpu: str, checkpoint: str, budget: int, seed: int, folds: list[int], work: Path) -> dict:
    """One unguarded replayed fine-tune: its card, and the cross-fit's verdict under each fold count."""
    args = FinetuneArgs(gpu=gpu, budget=str(budget), db=str(work / "d.sqlite"), checkpoint=checkpoint,
                        output=str(work), seed=seed, replay=db_path, snapshot=False, guard=False, wandb=False)
    card = run(args)
    spec, start = hardware_specs.load(gpu), Policy.load(checkpoint)
    problems = [GemmProblem.from_key(k) for k in card["problems"]]
    with Database(args.db) as db:
        verdicts = {f: cross_fit(start, problems, spec, db, "real", args.plan, args.rounds, seed, folds=f)
                    for f in folds}
    return {"weights": str(work / card["checkpoint"]),
            # fold counts as strings, as JSON keys come back from --out
            "verdicts": {str(f): dataclasses.asdict(v) | {"keep_adapted": v.keep_adapted} for f, v in verdicts.items()}}


def summarise(runs: list[dict], starts: dict[str, dict], folds: list[int]) -> str:
    """Markdown table: per checkpoint and budget, no guard and each fold count (mean over seeds)."""
    head = ["checkpoint", "B", "no guard: top-1 / best of 8 (top-1 range)"]
    head += [f"guard, {f} folds: top-1 / best of 8, kept, wrong" for f in folds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["checkpoint"], r["budget"]) for r in runs}, key=lambda k: (k[0], k[1]))
    for ck, b in keys:
        cell = [r for r in runs if (r["checkpoint"], r["budget"]) == (ck, b)]
        start = starts[ck]
        raw = [r["top1"] for r in cell]
        row = [Path(ck).stem, str(b), f"{statistics.mean(raw):.3f} / {statistics.mean(r['best_of_8'] for r in cell):.3f} "
                                      f"({min(raw):.3f}-{max(raw):.3f})"]
        for f in folds:
            kept = [r["verdicts"][str(f)]["keep_adapted"] for r in cell]
            got = [(r["top1"], r["best_of_8"]) if k else (start["top1"], start["best_of_8"]) for r, k in zip(cell, kept)]
            wrong = sum(r["top1"] < start["top1"] if k else r["top1"] > start["top1"] for r, k in zip(cell, kept))
            row.append(f"{statistics.mean(g[0] for g in got):.3f} / {statistics.mean(g[1] for g in got):.3f}, "
                       f"{sum(kept)} of {len(cell)}, {wrong}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database with real rows of --gpu (the shipped snapshot is loaded into it)")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--split", default="val", help="split the picks are scored on (val: choosing, not reporting)")
    ap.add_argument("--checkpoints", default="checkpoints/meta.pt,checkpoints/plain.pt")
    ap.add_argument("--budgets", default="16,32,64,128,256")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--folds", default="2,4,8", help="fold counts of the cross-fit to judge")
    ap.add_argument("--out", required=True, help="JSON file of every run's figures")
    ns = ap.parse_args(argv)
    spec = hardware_specs.load(ns.gpu)
    folds = [int(f) for f in ns.folds.split(",")]
    jobs = [(ck, int(b), int(s)) for ck in ns.checkpoints.split(",") for b in ns.budgets.split(",")
            for s in ns.seeds.split(",")]
    with Database(ns.db) as db:
        load_shipped(db)

        def score(weights: str) -> dict:
            got = evaluate(db, Policy.load(weights), spec, ns.split, False)
            return {"top1": got["rule_top1"], "best_of_8": got["rule_best_of_8"]}

        starts = {ck: score(ck) for ck in ns.checkpoints.split(",")}
        runs = []
        for ck, b, s in tqdm(jobs, desc="replayed fine-tunes", unit="run"):
            with tempfile.TemporaryDirectory() as work:
                r = replay_run(ns.db, ns.gpu, ck, b, s, folds, Path(work))
                runs.append({"checkpoint": ck, "budget": b, "seed": s, **score(r["weights"]), "verdicts": r["verdicts"]})
    table = summarise(runs, starts, folds)
    print(f"{spec.name}, {ns.split}: the starts score " + ", ".join(
        f"{Path(ck).stem} {v['top1']:.3f} / {v['best_of_8']:.3f}" for ck, v in starts.items()) + "\n\n" + table)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps({"gpu": spec.name, "split": ns.split, "starts": starts, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
