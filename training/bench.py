"""`gnn-policy bench`: the policy's picks and every baseline, measured for real on one split.

For each measured problem of the split, each method spends up to the largest budget of
real measurements (configs already in the database are not measured again; new ones are
stored), in its own order:
- `policy`: the checkpoint's top picks by beam search;
- `triton_tutorial`, `inductor_mm`, `seed`: the named lists in their order (what
  `triton.autotune` over them measures), valid configs only;
- `random`: valid configs of the full space in a seeded random order;
- `evolutionary`: the seed's loop without a prior (`gnn_policy.search`);
- `analytic`: the fitted analytic time model's ranking of the valid configs
  (checkpoints/analytic.json), the baseline a learned policy has to beat.
A method's figure at budget k is the best TFLOP/s among its first k measurements over best
known (after the run, so the run's own finds count), geomean over problems; a method with no
correct config yet scores 0.01. Writes a CSV, a markdown table, a PNG and an offline W&B run,
and puts the figures into the checkpoint's card.
"""
from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from pathlib import Path
from time import monotonic

from gnn_policy.args import at_least, flag, int_list, one_of, positive
from gnn_policy.collect import SPLIT_NAMES
from gnn_policy.database import DEFAULT_PATH
from gnn_policy.interrupts import on_interrupt
from gnn_policy.measure.workers import runner_path

FLOOR = 0.01


@dataclasses.dataclass(frozen=True)
class BenchArgs:
    """Measure the policy's top-k and the baselines on a split; fractions of best known per budget."""

    db: str = flag(str(DEFAULT_PATH), "the SQLite database; the shipped snapshot is loaded into it first")
    gpu: str = flag("", "GPU spec name (default: the local device)")
    split: str = flag("test", "suite split whose measured problems are benchmarked", check=one_of(*SPLIT_NAMES))
    problems: int = flag(40, "the split's first N problems in collection order (those a dense sweep "
                             "`collect --split test --problems N` measured), measured ones only; 0: all",
                         check=at_least(0))
    budgets: str = flag("1,2,4,8,16,32", "measurement counts to report", check=int_list(1))
    checkpoint: str = flag("", "policy checkpoint (default: checkpoints/pretrained.pt)")
    seed: int = flag(0, "seed of random and evolutionary search")
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is a timeout", check=positive)
    runner: str = flag("gnn_policy.measure.runner:measure_configs", "measuring function (package.module:function)",
                       check=runner_path)
    out: str = flag("docs/data/bench", "folder for bench.csv, bench.md and bench.png")
    shard_dir: str = flag("", "write the measurements this run adds to a new shard here")
    log_dir: str = flag("runs/bench", "folder of the offline W&B run")
    wandb: bool = flag(True, "log to W&B (offline unless WANDB_MODE is set)", off="write no W&B run")
    time_limit: float = flag(0.0, "minutes after which no new problem is started: the measurements so far are "
                                  "stored (and exported), no report is written, and a re-run goes on from there",
                             check=at_least(0, float))
    report_only: bool = flag(False, "measure nothing: rebuild bench.md, bench.png and the W&B run from the "
                                    "bench.csv in --out (measured on a GPU machine without wandb, say)")


def traces(problem, gpu, policy, measure, budget: int, seed: int, analytic) -> dict[str, list]:
    from gnn_policy.search import (evolutionary_search, fixed_list, given, random_search, run_searches,
                                   valid_configs)
    from gnn_policy.space import NAMED_LISTS

    space_ = policy.model.space
    valid = valid_configs(space_, gpu, problem)
    scores = analytic.predict_tflops(problem, valid, gpu)
    ranked = [valid[i] for i in sorted(range(len(valid)), key=lambda i: -scores[i])[:budget]]
    searches = {"policy": given([p.config for p in policy.top_k(problem, gpu, budget)]),
                **{name: fixed_list(configs, gpu, problem, budget) for name, configs in NAMED_LISTS.items()},
                "random": random_search(valid, budget, random.Random(f"{seed}:random:{problem.key}")),
                "evolutionary": evolutionary_search(valid, space_, budget, random.Random(f"{seed}:evo:{problem.key}")),
                "analytic": given(ranked)}
    return dict(zip(searches, run_searches([(problem, s) for s in searches.values()], measure)))


def fractions(trace: list, best: float, budgets: list[int]) -> dict[int, float]:
    out = {}
    for k in budgets:
        ok = [tf for _, tf in trace[:k] if tf is not None]
        out[k] = max(FLOOR, max(ok) / best) if ok else FLOOR
    return out


def run(args: BenchArgs) -> dict:
    if args.report_only:
        return report_from_csv(args)
    from tqdm import tqdm

    import hardware_specs
    from gnn_policy import distributed
    from gnn_policy.collect import select_problems
    from gnn_policy.database import Database
    from gnn_policy.measure.simulator import load_fitted
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
    from gnn_policy.search import local_measurer
    from gnn_policy.snapshot import RunExport, load_shipped

    db_path = distributed.as_rank(args.db, args.shard_dir)  # under torchrun: this rank's GPU and database
    gpu = hardware_specs.resolve(args.gpu)
    budgets = sorted(int(b) for b in args.budgets.split(","))
    policy = Policy.load(args.checkpoint or DEFAULT_CHECKPOINT)
    analytic = load_fitted(DEFAULT_CHECKPOINT.parent / "analytic.json")
    counts: defaultdict = defaultdict(int)
    with Database(db_path) as db:
        load_shipped(db)
        export = RunExport(db, args.shard_dir, gpu.name, distributed.shard_kind("bench")) if args.shard_dir else None
        measured = {p.key for p in db.problems(gpu.name)}
        problems = distributed.share([p for p in select_problems(args.split, args.problems, 0) if p.key in measured])
        stopped = on_interrupt(lambda: f"{counts['measured']} measurements stored in {args.db}; run the same "
                                       "command again to resume (what is measured is reused)")
        with stopped, local_measurer(db, gpu, counts, args.runner, args.timeout) as measure:
            real = measure.compiler is not None  # our runner on a GPU, not a test's stand-in
            deadline = monotonic() + args.time_limit * 60 if args.time_limit else float("inf")
            found = {}
            for p in tqdm(problems, desc=f"bench {gpu.name}", unit="problem"):
                if monotonic() > deadline:
                    break
                found[p.key] = traces(p, gpu, policy, measure, budgets[-1], args.seed, analytic)
        complete = len(found) == len(problems)
        rows = _rows(db, gpu.name, problems, found, budgets) if complete else []
        if export is not None:
            counts["shard_rows"] = export.write()
    if not complete:
        return {"problems": len(found), **counts, "stopped_by_time_limit": 1,
                "report": f"stopped by --time-limit after {len(found)} of {len(problems)} problems; run again "
                          "to finish (what is measured is reused), no report written"}
    if distributed.launch().world > 1:  # the report needs every rank's rows: --report-only merges the parts
        part = write_csv(rows, distributed.part_path(Path(args.out) / "bench.csv"))
        return {"problems": len(problems), **counts, "report": f"this rank's rows are in {part}; when every rank "
                f"is done, `gnn-policy bench --report-only --out {args.out}` merges them and writes the report"}
    report = write_report(rows, budgets, Path(args.out), gpu.name)
    # figures of a simulated runner would pass for the shipped checkpoint's real ones
    card = str(record_in_card(args, rows, budgets)) if real else "not updated: --runner does not measure a GPU"
    if args.wandb:
        _log_wandb(args, rows, report)
    return {"problems": len(problems), **counts, "report": report, "card": card}


def _rows(db, gpu: str, problems, found: dict, budgets: list[int]) -> list[dict]:
    """One row per (problem, method, k): fraction of best known, and the picks against cuBLAS."""
    from gnn_policy.benchmarks.data_report import problem_class
    from gnn_policy.measure.result import CUBLAS

    rows = []
    for p in problems:
        best = db.best_known(gpu, p.key)[1]
        cublas = db.tflops(gpu, p.key).get(CUBLAS)
        for method, trace in found[p.key].items():
            for k, frac in fractions(trace, best, budgets).items():
                ok = [tf for _, tf in trace[:k] if tf is not None]
                rows.append({"gpu": gpu, "problem": p.key, "class": problem_class(p), "method": method, "k": k,
                             "fraction": round(frac, 4),
                             "vs_cublas": round(max(ok) / cublas, 4) if ok and cublas else None})
    return rows


def report_from_csv(args: BenchArgs) -> dict:
    """The report and W&B run of an earlier bench, from its CSV (types restored); the parts that
    the ranks of a torchrun bench wrote are merged into that CSV first."""
    import csv

    from gnn_policy.distributed import merge_parts

    path = Path(args.out) / "bench.csv"
    merge_parts(path)
    if not path.exists():
        raise FileNotFoundError(f"--report-only needs {path}, the CSV of an earlier bench run")
    rows = [{**r, "k": int(r["k"]), "fraction": float(r["fraction"]),
             "vs_cublas": float(r["vs_cublas"]) if r["vs_cublas"] else None} for r in csv.DictReader(path.open())]
    budgets = sorted({r["k"] for r in rows})
    report = write_report(rows, budgets, Path(args.out), rows[0]["gpu"])
    record_in_card(args, rows, budgets)
    if args.wandb:
        _log_wandb(args, rows, report)
    return {"problems": len({r["problem"] for r in rows}), "report": report}


def summary(rows: list[dict], budgets: list[int]) -> dict[str, dict[int, float]]:
    from gnn_policy.benchmarks.data_report import geomean

    methods = list(dict.fromkeys(r["method"] for r in rows))
    return {m: {k: geomean([r["fraction"] for r in rows if r["method"] == m and r["k"] == k]) for k in budgets}
            for m in methods}


def write_csv(rows: list[dict], path: Path) -> Path:
    """The rows as CSV with a header (an empty file for no rows: a rank that owned no problem)."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def write_report(rows: list[dict], budgets: list[int], out: Path, gpu: str) -> str:
    write_csv(rows, out / "bench.csv")
    table = summary(rows, budgets)
    lines = [f"Fraction of best known on {gpu}, geomean over {len({r['problem'] for r in rows})} problems, "
             "by measurements spent:", "", "| method | " + " | ".join(f"k={k}" for k in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    lines += [f"| {m} | " + " | ".join(f"{v[k]:.3f}" for k in budgets) + " |" for m, v in table.items()]
    lines += ["", "Policy against cuBLAS (geomean of picked TFLOP/s / cuBLAS):", "",
              "| class | problems | top-1 | best of top-8 |", "|---|---|---|---|"]
    lines += [f"| {cls} | {v['problems']} | {v['top1']:.3f} | " + (f"{v['top8']:.3f}" if v["top8"] else "n/a") + " |"
              for cls, v in vs_cublas(rows).items()]
    text = "\n".join(lines)
    (out / "bench.md").write_text(text + "\n")
    _plot(table, budgets, out / "bench.png", gpu)
    return text


def vs_cublas(rows: list[dict]) -> dict[str, dict]:
    """Problem class (and "all") -> the policy's top-1 and best-of-8 TFLOP/s over cuBLAS, geomean."""
    from gnn_policy.benchmarks.data_report import CLASSES, geomean

    out = {}
    for cls in (*CLASSES, "all"):
        sel = [r for r in rows if r["method"] == "policy" and r["vs_cublas"] and cls in ("all", r["class"])]
        k1, k8 = ([r["vs_cublas"] for r in sel if r["k"] == k] for k in (1, 8))
        if k1:
            out[cls] = {"problems": len(k1), "top1": round(geomean(k1), 4),
                        "top8": round(geomean(k8), 4) if k8 else None}
    return out


def record_in_card(args: BenchArgs, rows: list[dict], budgets: list[int]) -> Path:
    """Put the bench figures into the checkpoint's card (<checkpoint>.card.json), so that the
    card of a shipped checkpoint says how it did on real runs. A retrained checkpoint gets a
    new card without them until bench runs again."""
    import json
    from datetime import date

    from gnn_policy.policy import DEFAULT_CHECKPOINT

    card_path = Path(args.checkpoint or DEFAULT_CHECKPOINT).with_suffix(".card.json")
    card = json.loads(card_path.read_text()) if card_path.exists() else {}
    card["bench"] = {
        "date": date.today().isoformat(), "gpu": rows[0]["gpu"], "split": args.split,
        "problems": len({r["problem"] for r in rows}), "csv": str(Path(args.out) / "bench.csv"),
        "fraction_of_best_known": {m: {str(k): round(v, 4) for k, v in vals.items()}
                                   for m, vals in summary(rows, budgets).items()},
        "policy_vs_cublas": vs_cublas(rows)}
    card_path.write_text(json.dumps(card, indent=1) + "\n")
    return card_path


def _plot(table: dict, budgets: list[int], path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, values in table.items():
        ax.plot(budgets, [values[k] for k in budgets], marker="o", label=method, lw=2.5 if method == "policy" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="real measurements per problem", ylabel="fraction of best known (geomean)",
           title=f"Tuners at equal measurement count, {gpu}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _log_wandb(args: BenchArgs, rows: list[dict], report: str) -> None:
    import wandb

    from training.tracking import wandb_run

    run = wandb_run(Path(args.log_dir), job_type="bench", group=f"bench-{args.split}", tags=[args.split],
                    config=dataclasses.asdict(args))
    budgets = sorted({r["k"] for r in rows})
    run.log({"bench/results": wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows]),
             **{f"bench/{m}/k{k}": v for m, vals in summary(rows, budgets).items() for k, v in vals.items()}})
    run.summary["bench/report"] = report
    run.finish()
