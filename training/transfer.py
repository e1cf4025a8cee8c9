"""`gnn-policy transfer --target h200`: how fast a policy adapts to a GPU it never saw.

For each budget B (total measurements on the target) and seed:
- `meta`, `plain`: the meta-pretrained and the plain checkpoint, both trained without the
  target (refused otherwise), fine-tuned on the target's train-split problems (--tune-split) with B
  measurements (B = 0: as they are). Each fine-tune has its own database, so it learns from
  its own B measurements alone, never from the snapshot.
- `scratch`: a randomly initialised policy of the plain checkpoint's architecture,
  fine-tuned the same way.
- `random`, `evolutionary`: search without a prior, spending B measurements on *each* test
  problem, more than the policies spend in all (B = 0: nothing found, not reported).
Spec-only baselines, the same at every B:
- `analytic`: the fitted analytic model's ranking (it must not have been fitted on the target);
- `triton_tutorial`, `inductor_mm`: autotune over the whole list (16 and 20 measurements a
  problem).
Every policy's top 8 picks on every test problem are then measured in --db, which holds best
known. top-1 is the first pick's TFLOP/s over best known, top-8 the best of the 8 (a search's
or a list's best found counts as both), geomean over problems; a failed pick scores 0.01.
With --simulate the analytic model gives every label and best known is its optimum over the
valid space (so `analytic` is the oracle there): a dry run of the protocol on the CPU. With
--replay DB the target's real rows stored in DB answer every measurement: each method chooses
among a problem's stored configs (a policy ranks those, a search draws and breeds among them,
a named list keeps the members stored), best known is the best stored, and the fine-tunes tune
on the target's stored --tune-split problems (`finetune --replay`): the protocol on real
labels, on the CPU, for a target with densely swept evaluation problems and rows to tune on
(the H200's test and train splits; the H100's random-test and random-train).

Writes transfer.csv (one row per method, budget, seed and problem), transfer.md,
transfer.png (transfer.partial.* while --time-limit leaves runs undone), and one offline W&B
run per (method, budget, seed): job_type `transfer`, group
`transfer-<target>`, tags method= budget= seed=, keys transfer/top1 and transfer/top8 and a
wandb.Table. Resumable: each finished run's picks (config keys) go to runs.jsonl in --out, which
a re-run reuses on any machine while the run's inputs are unchanged (`transfer_picks.run_settings`);
the picks are valued from --db when the report is made, so the shards they were measured into
must come along. An unfinished fine-tune resumes from its state in --work; stored measurements
are not taken again.

This module runs the experiment and values the picks; `training.transfer_args` holds its
flags and the checks made first, `training.transfer_picks` makes each method's picks,
`training.transfer_report` writes the report and the W&B runs.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from time import monotonic

from gnn_policy.interrupts import on_interrupt
from training import transfer_picks
from training.finetune_budget import PER_PROBLEM
from training.transfer_args import (POLICIES, SEARCHES, SPEC_ONLY, TransferArgs, TransferError, check_held_out,
                                    with_folders)
from training.transfer_log import TransferLog, file_digest, fingerprint
from training.transfer_report import log_wandb, measurements_to_reach, write_report

# the names the CLI and the tests import from here, wherever they live
__all__ = ["TransferArgs", "TransferError", "check_held_out", "measurements_to_reach", "run", "with_folders"]

FLOOR = 0.01
PARTIAL = "transfer.partial"  # the report of a time-limited call's finished runs, removed once all are done
RUN_LOG = "runs.jsonl"  # in --out: finished runs' picks, what a re-run on a fresh machine reuses
EXPORTED = "transfer:exported"  # database meta: high water of transfer's last shard export


def run(args: TransferArgs) -> dict:
    if args.report_only or args.target:
        args = with_folders(args)
    if args.report_only:
        return report_from_csv(args)
    if not (args.target and args.plain):
        raise TransferError("--target and --plain are required (unless --report-only)")
    import contextlib

    from tqdm import tqdm

    import hardware_specs
    from gnn_policy.collect import select_problems
    from gnn_policy.database import Database
    from gnn_policy.measure.replay import ReplayPool
    from gnn_policy.measure.simulator import load_fitted
    from gnn_policy.policy import Policy
    from gnn_policy.search import Measurer, local_measurer
    from gnn_policy.snapshot import load_shipped, run_stamp

    spec = hardware_specs.load(args.target)
    check_held_out(args, spec.name)
    budgets = sorted(int(b) for b in args.budgets.split(","))
    seeds = [int(s) for s in args.seeds.split(",")]
    analytic = load_fitted(args.analytic)
    space_ = Policy.load(args.plain).model.space  # every method searches the space the policies rank
    source = "simulated" if args.simulate else "real"
    label = "replayed real" if args.replay else source
    pool = ReplayPool(args.replay, spec.name) if args.replay else None
    counts: defaultdict = defaultdict(int)
    rows: list[dict] = []
    # what each run's picks depend on, read once: a replayed database is large
    digests = {name: file_digest(getattr(args, name)) for name in ("meta", "plain", "analytic")
               if name != "meta" or "meta" in args.chosen_methods()}  # an unused --meta need not exist
    if pool is not None:
        digests["replay"] = file_digest(args.replay)
    with Database(_evaluation_db(args, digests)) as db, contextlib.ExitStack() as stack:
        exporting = bool(args.shard_dir) and not (args.simulate or args.replay)
        if exporting and db.meta(EXPORTED):  # rows of a killed run, shipped before new shards arrive after them
            counts["shard_rows"] += _export(db, args, spec.name, f"{run_stamp()}-recovered")
        if pool is None:  # a replay's figures are its database's alone
            load_shipped(db)
        if exporting:
            db.set_meta(EXPORTED, json.dumps(db.high_water()))
        # the split's problems collected first, with seed 0 as `collect` draws them (test: the dense sweeps)
        problems = select_problems(args.split, args.problems, 0)
        if pool is not None:
            problems = [p for p in problems if pool.figures(p)]
        elif not args.simulate:
            problems = [p for p in problems if db.best_known(spec.name, p.key)]  # a Triton best known to compare with
        if not problems:
            raise TransferError(f"no {args.split}-split problem is measured on {spec.name} in "
                                f"{args.replay or args.db}: collect them first")
        if "served" in args.chosen_methods() and budgets[-1] > PER_PROBLEM * len(problems):  # before any run
            raise TransferError(f"--budgets {budgets[-1]}: served fine-tunes on the {len(problems)} problems "
                                f"evaluated, at most {PER_PROBLEM} measurements each ({PER_PROBLEM * len(problems)})")
        if pool is not None:
            measure = Measurer(db, spec, pool, None, counts)
        else:
            measure = stack.enter_context(local_measurer(db, spec, counts, args.runner, args.timeout,
                                                         simulated=analytic if args.simulate else None))
        log = TransferLog(Path(args.out) / RUN_LOG)
        stack.enter_context(on_interrupt(lambda: f"{counts['runs']} runs finished this call, kept in {log.path}; "
                                                 f"measurements stored in {db.path}; run the same command again to "
                                                 "resume (an unfinished fine-tune goes on from --work)"))
        if log.damaged:
            print(f"{log.damaged} lines of {log.path} do not parse: skipped")
        # the searches last: at large B they measure most, and a time-limited call should leave them undone first
        jobs = [(m, b, s) for s in seeds for b in budgets for m in POLICIES]
        jobs += [(m, None, s) for s in seeds for m in SPEC_ONLY]
        jobs += [(m, b, s) for s in seeds for b in budgets if b for m in SEARCHES]
        chosen = args.chosen_methods()
        jobs = [job for job in jobs if job[0] in chosen]
        deadline = monotonic() + args.time_limit * 60 if args.time_limit else float("inf")
        left, counts["runs"] = 0, 0
        for method, budget, seed in tqdm(jobs, desc=f"transfer to {spec.name}", unit="run"):
            tune = transfer_picks.finetune_settings(args, method, spec.name, source, space_, digests, problems) \
                if method in POLICIES and budget else {}
            settings = transfer_picks.run_settings(args, method, spec.name, source, problems, space_, digests, tune)
            picks, kept = log.get(settings, method, budget, seed), log.kept(settings, method, budget, seed)
            if picks is None:
                if counts["runs"] and monotonic() > deadline:  # the first new run always goes; reused ones are free
                    left += 1
                    continue
                picks, kept = transfer_picks.method_picks(args, method, budget, seed, spec, problems, measure,
                                                          analytic, space_, fingerprint(tune), digests["plain"],
                                                          pool.offers if pool is not None else None)
                if exporting:  # after every run: a killed call loses at most the run in flight
                    counts["shard_rows"] += _export(db, args, spec.name, f"{run_stamp()}-{method}-B{budget}-s{seed}")
                    db.set_meta(EXPORTED, json.dumps(db.high_water()))
                log.add(settings, method, budget, seed, picks, kept)
                counts["runs"] += 1
            rows += [{"target": spec.name, "split": args.split, "source": label, "method": method, "budget": budget,
                      "seed": seed, "problem": p.key, "kept": kept or "", "picks": picks[p.key]} for p in problems]
        # picks are config keys, valued now: re-timings since a run count, as they do in best known
        if pool is not None:
            known = {p.key: pool.figures(p) for p in problems}
            stored = {p.key: pool.offers(p) for p in problems}
            best = {p.key: max(known[p.key].values()) for p in problems}
        else:
            known = {p.key: db.tflops(spec.name, p.key, source) for p in problems}
            stored = {p.key: {c for _, c in db.measured(spec.name, source, problem=p.key)} for p in problems}
            best = {p.key: _best_known(db, spec, p, source, analytic, space_) for p in problems}
    unstored = sum(k is not None and k not in stored[r["problem"]] for r in rows for k in r["picks"])
    if unstored:
        print(f"{unstored} picks have no row in {_evaluation_db(args, digests)} and score as failures: load the shards "
              f"measured with {RUN_LOG}'s runs (data/measurements)")
    for r in rows:
        values = [known[r["problem"]].get(k) if k else None for k in r.pop("picks")]
        r["top1"] = _fraction(values[:1], best[r["problem"]])
        r["top8"] = _fraction(values, best[r["problem"]])
    out = Path(args.out)
    done = len(jobs) - left
    if left:
        partial = write_report(rows, budgets, out, spec.name, label, PARTIAL,
                               f"Partial: {done} of {len(jobs)} runs finished (--time-limit); run again to finish.")
        return {"target": spec.name, "problems": len(problems), **counts, "stopped_by_time_limit": 1,
                "report": f"stopped by --time-limit after {done} of {len(jobs)} runs; run again to finish "
                          f"(finished runs are kept in {out / RUN_LOG}, measurements are reused); "
                          f"the finished runs' {PARTIAL}.md so far:\n{partial}"}
    for stale in out.glob(f"{PARTIAL}.*"):
        stale.unlink()
    report = write_report(rows, budgets, out, spec.name, label)
    if args.wandb:
        log_wandb(args, rows, spec.name)
    return {"target": spec.name, "problems": len(problems), **counts, "report": report}


def _export(db, args: TransferArgs, target: str, stamp: str) -> int:
    """Export the evaluation rows stored since the last export; a shard the disk refuses leaves
    the mark where it was, so the next call exports them (as it does a killed call's)."""
    from gnn_policy import snapshot

    try:
        since = tuple(json.loads(db.meta(EXPORTED)))
        return snapshot.export_run(db, args.shard_dir, target, "transfer", since, stamp)
    except OSError as exc:
        raise snapshot.ShardWriteError(f"could not write a shard to {args.shard_dir} ({exc.strerror or exc}); "
                                       f"the rows stay in {db.path}, and the next run with --shard-dir exports "
                                       "them") from None


def _evaluation_db(args: TransferArgs, digests: dict[str, str]) -> Path:
    """--db; under --simulate a database of the analytic model's own (one per model file), so
    neither simulated rows of another model nor the real database enter the comparison; under
    --replay one per replayed file, holding the rows the methods asked for. `digests`: the
    files' `file_digest`s."""
    if args.replay:
        return Path(args.work) / f"replay-{digests['replay'][:12]}.sqlite"
    if not args.simulate:
        return Path(args.db)
    return Path(args.work) / f"simulated-{digests['analytic'][:12]}.sqlite"


def _fraction(values: list, best: float) -> float:
    ok = [v for v in values if v is not None]
    return round(max(FLOOR, min(1.0, max(ok) / best)), 4) if ok else FLOOR


def _best_known(db, spec, problem, source: str, analytic, space_) -> float:
    if source == "simulated":  # the label source's optimum over every valid config
        from gnn_policy.search import valid_configs

        return max(analytic.predict_tflops(problem, valid_configs(space_, spec, problem), spec))
    return max(v for k, v in db.tflops(spec.name, problem.key).items() if k != "cublas")


def report_from_csv(args: TransferArgs) -> dict:
    """The report and W&B runs of an earlier transfer run, from its CSV (types restored)."""
    import csv

    path = Path(args.out) / "transfer.csv"
    if not path.exists():
        raise TransferError(f"--report-only needs {path}, the CSV of an earlier transfer run")
    rows = [{**r, "budget": int(r["budget"]) if r["budget"] else None, "seed": int(r["seed"]),
             "top1": float(r["top1"]), "top8": float(r["top8"])} for r in csv.DictReader(path.open())]
    target = rows[0]["target"]
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    report = write_report(rows, budgets, Path(args.out), target, rows[0]["source"])
    if args.wandb:
        log_wandb(args, rows, target)
    return {"target": target, "problems": len({r["problem"] for r in rows}), "report": report}

