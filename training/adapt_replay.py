"""Adaptation strategies compared on replayed real labels (CPU): which adaptation helps a held-out GPU?

    python -m training.adapt_replay --db /tmp/adapt/all.sqlite --checkpoints meta=/tmp/adapt/meta.pt \\
        --out docs/data/adapt/replay.json

For each target GPU, checkpoint, strategy (`finetune --strategy`), budget B and seed,
`finetune --replay --no-guard` spends B measurements on 8 tuning problems, answered from the
real rows --db holds for the target, and the guard's cross-fit (`training.guard.cross_fit`)
is asked on the run's own measurements which weights it would keep. A guarded run's figure
follows from the weights it keeps, so one run gives both. The evaluation problems follow
`gnn-policy transfer`'s protocol as far as the stored rows allow: the test split's first 40
problems in collection order that have a best known on the target, less any the fine-tune
tuned on. The H200 tunes on train-split problems, as `transfer` does (the H100 on random-train);
a slice has rows of one split alone (sm48 of test, the others of train), so it tunes on 8
problems of the split evaluated and is scored on the others. Each
policy's first pick (its first-pick rule) and best of 8 (`Policy.top_k`'s order) among a
problem's stored configs are scored as a fraction of best known (the best stored config of
the problem), geomean over the problems. B = 0 is the checkpoint itself on the same problems.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
from pathlib import Path

import hardware_specs
from graphs import GemmProblem
from graphs.random_gemms import SPLITS as RANDOM_SPLITS
from gnn_policy.collect import select_problems
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import Policy, diverse_order
from training.finetune import FinetuneArgs, run
from training.guard import EVERY_FOLD, MIN_SCORED, calibrated_only, cross_fit, first_choice, usable
from training.tuning_problems import REPLAY_HORIZON

EVAL_PROBLEMS = 40  # transfer's --problems
MIN_SCORED_JUDGED = (2, 4)  # the guard's cross-fit is asked under each: how many configs a judged problem needs
# where a target tunes; a GPU not named (a slice) tunes on the split it is evaluated on, the only one it has rows of
TUNE_SPLIT = {"H200-SXM-141GB": "train", "H100-SXM5-80GB": "random-train"}


@dataclasses.dataclass(frozen=True)
class Score:
    top1: float  # geomean over problems of the first pick's TFLOP/s over best known
    best_of_8: float  # the same for the best of the first 8 in top_k's order
    problems: int


def evaluation_problems(db: Database, gpu: str, tuned: set[str], split: str = "test") -> list[GemmProblem]:
    """The split's first EVAL_PROBLEMS problems that have a best known on `gpu`, less those tuned
    on; of a random split, the first EVAL_PROBLEMS measured ones (a slice holds a sample of them)."""
    random_split = split in RANDOM_SPLITS
    out = [p for p in select_problems(split, REPLAY_HORIZON if random_split else EVAL_PROBLEMS, 0)
           if db.best_known(gpu, p.key) and p.key not in tuned][:EVAL_PROBLEMS]
    if not out:
        raise ValueError(f"no {split} problem has rows of {gpu} to be scored on, besides those tuned on")
    return out


def score(policy: Policy, spec, db: Database, problems: list[GemmProblem]) -> Score:
    """First pick and best of 8 among each problem's stored configs (see the module doc)."""
    top1, best8 = [], []
    for p in problems:
        figures = {k: v for k, v in db.tflops(spec.name, p.key).items() if k != CUBLAS}
        configs = usable(policy, p, spec, figures)
        best = max(figures.values())
        first = first_choice(policy, p, spec, configs)
        order = top_k_order(policy, p, spec, configs, first)
        top1.append(figures[configs[first].key] / best)
        best8.append(max(figures[configs[i].key] for i in order[:8]) / best)
    return Score(_geomean(top1), _geomean(best8), len(problems))


def served(start: Policy, adapted: Policy, spec, db: Database, tuned: list[GemmProblem], winners: dict) -> dict:
    """On the problems the fine-tune tuned on (the ones a user serves), geomean fractions of best
    known: the start's first pick among the stored configs, and the unguarded run's: its measured
    winner where it measured the problem (what `top_k` then picks first), else its first pick."""
    fractions = []
    for p in tuned:
        if p.key in winners:  # the replayed figure of the winner, as the start's pick is scored
            figures = {k: v for k, v in db.tflops(spec.name, p.key).items() if k != CUBLAS}
            fractions.append(figures[winners[p.key]["config"]] / max(figures.values()))
        else:
            fractions.append(score(adapted, spec, db, [p]).top1)
    return {"problems": len(tuned), "measured": len(winners), "start": score(start, spec, db, tuned).top1,
            "winners": _geomean(fractions)}


def ranked_among(policy: Policy, p, spec, keys) -> list:
    """Every config of `keys` the policy can pick (`usable`), in `Policy.top_k`'s order: what a
    replay offers, ranked as `tune` lists picks (past `top_k_order`'s first 8, by prediction)."""
    import torch

    configs = usable(policy, p, spec, keys)
    if not configs:
        return []
    order = top_k_order(policy, p, spec, configs, first_choice(policy, p, spec, configs))
    if len(order) < len(configs):
        idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
        order = list(dict.fromkeys(order + policy.predicted(p, spec, idx)[0].argsort(descending=True).tolist()))
    return [configs[i] for i in order]


def top_k_order(policy: Policy, p, spec, configs: list, first: int) -> list[int]:
    """`Policy.top_k`'s order on these configs: best predicted then one of each group
    (cost_model 1); the first pick then the others by probability (cost_model 0)."""
    import torch

    idx = torch.tensor([policy.model.space.index(c) for c in configs])[None]
    if policy.model.cfg.cost_model == 1:
        by_pred = policy.predicted(p, spec, idx)[0].argsort(descending=True).tolist()
        return [by_pred[i] for i in diverse_order([configs[i] for i in by_pred], 8)]
    with torch.no_grad():
        h, mask = policy.encode(p, spec)
        by_prob = policy.model.log_prob(h, idx, mask)[0].argsort(descending=True).tolist()
    return [first] + [i for i in by_prob if i != first]


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def replay_run(db: Database, db_path: str, gpu: str, checkpoint: str, strategy: str, budget: int, seed: int,
               work: Path, split: str = "test", **settings) -> dict:
    """One replayed fine-tune: the start, the unguarded and the guarded weights scored on the
    evaluation problems, and what the guard kept."""
    spec = hardware_specs.load(gpu)
    args = FinetuneArgs(gpu=gpu, budget=str(budget), db=str(work / "d.sqlite"), checkpoint=checkpoint,
                        output=str(work), split=TUNE_SPLIT.get(spec.name, split), seed=seed, replay=db_path,
                        snapshot=False, guard=False, strategy=strategy, wandb=False, **settings)
    card = run(args)
    start, adapted = Policy.load(checkpoint), Policy.load(work / card["checkpoint"])
    tuned = [GemmProblem.from_key(k) for k in card["problems"]]
    problems = evaluation_problems(db, spec.name, set(card["problems"]), split)
    figures = {"start": start, "adapted": adapted}
    out = {"gpu": spec.name, "checkpoint": checkpoint, "strategy": strategy, "budget": budget, "seed": seed,
           "split": split, "settings": settings, "tuned": card["problems"],
           "start": dataclasses.asdict(score(start, spec, db, problems)),
           "unguarded": dataclasses.asdict(score(adapted, spec, db, problems)),
           "served": served(start, adapted, spec, db, tuned, card["measured_winners"])}
    with Database(args.db) as own:
        for least in MIN_SCORED_JUDGED:
            judged = cross_fit(start, tuned, spec, own, "real", args.plan, args.rounds, seed, min_scored=least,
                               rank=least == MIN_SCORED_JUDGED[0])
            for every, signal in ((False, "pick"), (True, "pick"), (False, "rank")):
                if signal == "rank" and least != MIN_SCORED_JUDGED[0]:
                    continue  # the ranking counts pairs of every problem: `least` does not apply
                verdict = dataclasses.replace(judged, every_fold=every, signal=signal)
                kept = verdict.kept
                if kept not in figures:
                    figures[kept] = calibrated_only(start, tuned, spec, own, "real", args.plan, args.rounds, seed)
                out["guard-rank" if signal == "rank" else _guard_key(least, every)] = {
                    "kept": kept, "verdict": dataclasses.asdict(verdict),
                    "score": out["unguarded"] if kept == "adapted" else out["start"] if kept == "start"
                    else dataclasses.asdict(score(figures[kept], spec, db, problems))}
    return out


def _guard_key(least: int, every_fold: bool) -> str:
    return f"guard{least}" + ("-every-fold" if every_fold else "")


def summarise(runs: list[dict], least: int = MIN_SCORED, every_fold: bool = EVERY_FOLD, rank: bool = False) -> str:
    """Markdown: per target, checkpoint and strategy, top-1 / best of 8 by budget (means over
    seeds, the top-1 range in brackets), unguarded and guarded (judging problems with at least
    `least` configs; with `every_fold`, a stage no worse on any fold), and what each guarded run
    kept (a: adapted, c: the calibration alone, s: the start); with `rank`, the guard judging by
    held-out pairs ordered as measured. B = 0 is each seed's start on its evaluation problems."""
    guarded = "guard-rank" if rank else _guard_key(least, every_fold)
    budgets = sorted({r["budget"] for r in runs})
    lines = ["| GPU | checkpoint | strategy | guard | B=0 | " + " | ".join(f"B={b}" for b in budgets) + " |",
             "|---|---|---|---|---|" + "---|" * len(budgets)]
    for gpu, ck, strategy in dict.fromkeys((r["gpu"], r["checkpoint"], r["strategy"]) for r in runs):
        mine = [r for r in runs if (r["gpu"], r["checkpoint"], r["strategy"]) == (gpu, ck, strategy)]
        first = [r for r in mine if r["budget"] == min(x["budget"] for x in mine)]
        for guard in ("unguarded", guarded):
            cells = [_cell([r["start"] for r in first])]
            for b in budgets:
                cell = [r for r in mine if r["budget"] == b]
                if not cell or guard not in cell[0]:  # none, or runs from before the rank guard
                    cells.append("-")
                elif guard == "unguarded":
                    cells.append(_cell([r[guard] for r in cell]))
                else:
                    cells.append(_cell([r[guard]["score"] for r in cell]) + ", kept "
                                 + " ".join(r[guard]["kept"][0] for r in cell))
            name = "unguarded" if guard == "unguarded" else "guarded (held-out pairs)" if rank else \
                f"guarded ({least}+ configs" + (", every fold)" if every_fold else ")")
            lines.append(f"| {gpu} | {Path(ck).stem} | {strategy} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise_served(runs: list[dict]) -> str:
    """Markdown: per target and checkpoint, the start's first pick on the tuned problems and the
    run's measured winners there, by budget (means over seeds)."""
    budgets = sorted({r["budget"] for r in runs})
    lines = ["| GPU | checkpoint | tuned problems: start / measured winner | " + " | ".join(f"B={b}" for b in budgets)
             + " |", "|---|---|---|" + "---|" * len(budgets)]
    for gpu, ck in dict.fromkeys((r["gpu"], r["checkpoint"]) for r in runs if "served" in r):
        cells = []
        for b in budgets:
            cell = [r["served"] for r in runs if (r["gpu"], r["checkpoint"], r["budget"]) == (gpu, ck, b) and "served" in r]
            cells.append(f"{statistics.mean(c['start'] for c in cell):.3f} / {statistics.mean(c['winners'] for c in cell):.3f}"
                         if cell else "-")
        lines.append(f"| {gpu} | {Path(ck).stem} | | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(figs: list[dict]) -> str:
    top1 = [f["top1"] for f in figs]
    return f"{statistics.mean(top1):.3f} / {statistics.mean(f['best_of_8'] for f in figs):.3f} " \
           f"({min(top1):.3f}-{max(top1):.3f})"


def _starts(ns: argparse.Namespace) -> None:
    """--starts: a table of top-1 / best of 8 per GPU and checkpoint, written to --out as JSON too."""
    rows = []
    with Database(ns.db) as db:
        for gpu in ns.gpus.split(","):
            spec = hardware_specs.load(gpu)
            problems = evaluation_problems(db, spec.name, set(), ns.split)
            for ck in ns.checkpoints.split(","):
                rows.append({"gpu": spec.name, "checkpoint": ck, "split": ns.split,
                             **dataclasses.asdict(score(Policy.load(ck), spec, db, problems))})
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps({"starts": rows}, indent=1) + "\n")
    print("| GPU | checkpoint | problems | top-1 | best of 8 |\n|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['gpu']} | {r['checkpoint']} | {r['problems']} | {r['top1']:.3f} | {r['best_of_8']:.3f} |")


def _number(text: str) -> int | float:
    return int(text) if text.lstrip("-").isdigit() else float(text)


def main(argv: list[str] | None = None) -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database holding the targets' real rows (the shipped snapshot)")
    ap.add_argument("--gpus", default="h200-sm48,h200")
    ap.add_argument("--checkpoints", required=True, help="checkpoints, comma-separated")
    ap.add_argument("--strategies", default="whole,calibrate,calibrate-whole")
    ap.add_argument("--budgets", default="16,32,64")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--split", default="test", help="split the evaluation problems come from (val: choosing settings "
                                                     "on the H200 without looking at test)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a finetune setting for every run, e.g. calibration_lr=1e-3 (repeatable)")
    ap.add_argument("--starts", action="store_true", help="only score each checkpoint as it is (B = 0) on every "
                                                           "evaluation problem of each GPU, none left out for tuning")
    ap.add_argument("--out", required=True, help="JSON file of every run's figures (runs already there are kept)")
    ns = ap.parse_args(argv)
    if ns.starts:
        return _starts(ns)
    out = Path(ns.out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    settings = {k: _number(v) for k, v in (item.split("=", 1) for item in ns.set)}
    done = {(r["gpu"], r["checkpoint"], r["strategy"], r["budget"], r["seed"]) for r in runs}
    jobs = [(g, ck, st, int(b), int(s)) for g in ns.gpus.split(",") for ck in ns.checkpoints.split(",")
            for st in ns.strategies.split(",") for b in ns.budgets.split(",") for s in ns.seeds.split(",")]
    jobs = [j for j in jobs if (hardware_specs.load(j[0]).name, *j[1:]) not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    with Database(ns.db) as db:
        for gpu, ck, strategy, budget, seed in tqdm(jobs, desc="replayed fine-tunes", unit="run"):
            with tempfile.TemporaryDirectory() as work:
                runs.append(replay_run(db, ns.db, gpu, ck, strategy, budget, seed, Path(work), ns.split, **settings))
            out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")  # a killed call keeps what finished
    print("\n\n".join([summarise(runs, least, every) for least in MIN_SCORED_JUDGED for every in (False, True)]
                      + [summarise(runs, rank=True), summarise_served(runs)]))


if __name__ == "__main__":
    main()
