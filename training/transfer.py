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
on the target's stored train-split problems (`finetune --replay`): the protocol on real labels,
on the CPU, for a target with a dense test split and train rows (the H200's snapshot).

Writes transfer.csv (one row per method, budget, seed and problem), transfer.md,
transfer.png (transfer.partial.* while --time-limit leaves runs undone), and one offline W&B
run per (method, budget, seed): job_type `transfer`, group
`transfer-<target>`, tags method= budget= seed=, keys transfer/top1 and transfer/top8 and a
wandb.Table. Resumable: each finished run's picks (config keys) go to runs.jsonl in --out, which
a re-run reuses on any machine while the run's inputs are unchanged (`transfer_picks.run_settings`);
the picks are valued from --db when the report is made, so the shards they were measured into
must come along. An unfinished fine-tune resumes from its state in --work; stored measurements
are not taken again.

This module runs the experiment and values the picks; `training.transfer_picks` makes each
method's picks, `training.transfer_report` writes the report and the W&B runs.
"""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from time import monotonic

from gnn_policy.args import at_least, flag, int_list, one_of, positive
from gnn_policy.collect import SPLIT_NAMES
from gnn_policy.database import DEFAULT_PATH
from gnn_policy.interrupts import on_interrupt
from gnn_policy.measure.workers import runner_path
from training import transfer_picks
from training.adaptation import STRATEGIES
from training.finetune import PER_PROBLEM, FinetuneArgs
from training.transfer_log import TransferLog, file_digest, fingerprint
from training.transfer_picks import POLICIES, SEARCHES, SPEC_ONLY
from training.transfer_report import log_wandb, measurements_to_reach, write_report

# the names the CLI and the tests import from here, wherever they live
__all__ = ["TransferArgs", "TransferError", "check_held_out", "measurements_to_reach", "run", "with_folders"]

FLOOR = 0.01
PARTIAL = "transfer.partial"  # the report of a time-limited call's finished runs, removed once all are done
RUN_LOG = "runs.jsonl"  # in --out: finished runs' picks, what a re-run on a fresh machine reuses
EXPORTED = "transfer:exported"  # database meta: high water of transfer's last shard export
CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


class TransferError(RuntimeError):
    """The experiment cannot be run as asked: a checkpoint or model that saw the target."""


@dataclasses.dataclass(frozen=True)
class TransferArgs:
    """Adapt meta, plain and from-scratch policies to a held-out GPU at several budgets; compare with baselines."""

    target: str = flag("", "the held-out GPU: h200, or a slice of the local one (h200-sm48); required "
                           "unless --report-only")
    plain: str = flag("", "plain pretrained checkpoint trained without the target (the shipped "
                          "pretrained.pt saw the H200); required unless --report-only")
    budgets: str = flag("0,16,32,64,128,256", "total measurements on the target, comma-separated",
                        check=int_list(0))
    seeds: str = flag("0", "seeds, comma-separated (fine-tune choices, scratch weights, searches)", check=int_list(0))
    meta: str = flag(str(CHECKPOINTS / "meta.pt"), "meta-pretrained checkpoint, trained without the target")
    analytic: str = flag(str(CHECKPOINTS / "analytic-slices.json"), "analytic model, fitted without the target "
                                                                    "(the default: on H200 slices only)")
    db: str = flag(str(DEFAULT_PATH), "database holding best known on the target; evaluation picks are stored "
                                      "here (--simulate uses a database of its own under --work)")
    split: str = flag("test", "split evaluated on: test to report, val to choose fine-tune settings without it",
                      check=one_of(*SPLIT_NAMES))
    problems: int = flag(40, "the split's first N problems in collection order (for test, a dense sweep's), "
                             "those measured on the target, to evaluate on (0: the whole split)", check=at_least(0))
    tune_problems: int = flag(8, "problems of --tune-split each fine-tune spends its budget on", check=at_least(1))
    tune_split: str = flag("train", "split the fine-tunes tune on (random-train with a random evaluation split); "
                                    "never the evaluated one", check=one_of(*SPLIT_NAMES))
    rounds: int = flag(4, "fine-tune rounds", check=at_least(1))
    strategy: str = flag(FinetuneArgs.strategy, "what the fine-tunes adapt (finetune's --strategy and default)",
                         check=one_of(*STRATEGIES))
    steps: int = flag(FinetuneArgs.steps, "gradient steps per fine-tune round (finetune's default)", check=at_least(0))
    lr: float = flag(FinetuneArgs.lr, "learning rate of the fine-tunes (finetune's default)", check=positive)
    simulate: bool = flag(False, "label everything with the analytic model (CPU dry run)")
    replay: str = flag("", "answer every measurement from the target's real rows stored in this database (a CPU "
                           "run on real labels): every method chooses among a problem's stored configs, best "
                           "known is the best of them, fine-tunes tune on the stored train-split problems")
    runner: str = flag("gnn_policy.measure.runner:measure_configs", "measuring function (package.module:function)",
                       check=runner_path)
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is a timeout", check=positive)
    work: str = flag("", "folder of the fine-tunes' databases, checkpoints and W&B runs (default: "
                         "runs/transfer/<target>)")
    out: str = flag("", "folder for transfer.csv, transfer.md, transfer.png and runs.jsonl (default: "
                        "docs/data/transfer/<target>)")
    wandb: bool = flag(True, "log to W&B (offline unless WANDB_MODE is set)", off="write no W&B run")
    time_limit: float = flag(0.0, "minutes after which no further (method, budget, seed) run starts (the first "
                                  "always does): what was measured is kept, the finished runs are reported in "
                                  "transfer.partial.*, and a re-run goes on from there", check=at_least(0, float))
    shard_dir: str = flag("", "after each (method, budget, seed) run, write the evaluation measurements added "
                              "since the last export to a new shard here (e.g. data/measurements), so a fresh "
                              "machine can resume")
    report_only: bool = flag(False, "run nothing: rebuild transfer.md, transfer.png and the W&B runs from the "
                                    "transfer.csv in --out (written on a GPU machine without wandb, say)")

    def __post_init__(self) -> None:
        if self.tune_split == self.split:  # the tuned problems would be among those scored
            raise ValueError(f"--tune-split {self.tune_split} is the split evaluated: tune on another")
        if self.replay and self.simulate:
            raise ValueError("--replay answers from stored real rows, --simulate from the analytic model: choose one")
        most = max(int(b) for b in self.budgets.split(","))
        if most > PER_PROBLEM * self.tune_problems:  # each fine-tune would refuse it, after the runs before it
            raise ValueError(f"--budgets {most}: a fine-tune measures at most {PER_PROBLEM} per tuning problem, "
                             f"{PER_PROBLEM * self.tune_problems} for {self.tune_problems} (--tune-problems)")


def seen_gpus(path: str | Path) -> tuple[str, ...]:
    """The GPUs a checkpoint has an embedding for: those it was trained on. The whole policy is
    loaded, so a file that is not one is refused before the experiment starts."""
    from gnn_policy.policy import Policy

    return tuple(Policy.load(path).model.cfg.gpu_names)


def check_held_out(args: TransferArgs, target: str) -> None:
    from gnn_policy.measure.simulator import fitted_gpus

    for name, path in (("--meta", args.meta), ("--plain", args.plain)):
        if not Path(path).exists():
            raise TransferError(f"{name} {path} does not exist")
        if target in seen_gpus(path):
            raise TransferError(f"{name} {path} was trained on {target}, the held-out target: pretrain "
                                f"without it (e.g. gnn-policy pretrain --gpus h200-sm64 ... --out DIR)")
        card = Path(path).with_suffix(".card.json")  # meta.pt -> meta.card.json
        simulator = json.loads(card.read_text()).get("simulator", {}) if card.exists() else {}
        if target in simulator.get("fitted_on", []) and not args.simulate:
            raise TransferError(f"{name} {path} learned from simulated labels of an analytic model fitted on "
                                f"{target}, the held-out target ({card}): refit the model without it and pretrain again")
    if target in fitted_gpus(args.analytic) and not args.simulate:
        raise TransferError(f"--analytic {args.analytic} was fitted on {target}, the held-out target: "
                            "fit it on other GPUs' data")


def with_folders(args: TransferArgs) -> TransferArgs:
    """--out and --work defaulted per target (by its spec name, whatever alias named it), so two
    targets' reports and fine-tunes stay apart."""
    import hardware_specs

    if args.target:
        folder = hardware_specs.load(args.target).name.lower()
    elif args.report_only and args.out:
        folder = Path(args.out).name
    else:
        raise TransferError("give --target (or, with --report-only, --out)")
    folder += "-replay" if args.replay else ""  # replayed runs never mix with measured ones
    return dataclasses.replace(args, out=args.out or f"docs/data/transfer/{folder}",
                               work=args.work or f"runs/transfer/{folder}")


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
    from gnn_policy.measure.simulator import load_fitted
    from gnn_policy.policy import Policy
    from gnn_policy.measure.replay import ReplayPool
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
    with Database(_evaluation_db(args)) as db, contextlib.ExitStack() as stack:
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
        deadline = monotonic() + args.time_limit * 60 if args.time_limit else float("inf")
        left, counts["runs"] = 0, 0
        digests = {name: file_digest(getattr(args, name)) for name in ("meta", "plain", "analytic")}
        if pool is not None:
            digests["replay"] = file_digest(args.replay)
        for method, budget, seed in tqdm(jobs, desc=f"transfer to {spec.name}", unit="run"):
            tune = transfer_picks.finetune_settings(args, method, spec.name, source, space_, digests) \
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
        print(f"{unstored} picks have no row in {_evaluation_db(args)} and score as failures: load the shards "
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


def _evaluation_db(args: TransferArgs) -> Path:
    """--db; under --simulate a database of the analytic model's own (one per model file), so
    neither simulated rows of another model nor the real database enter the comparison; under
    --replay one per replayed file, holding the rows the methods asked for."""
    if args.replay:
        return Path(args.work) / f"replay-{file_digest(args.replay)[:12]}.sqlite"
    if not args.simulate:
        return Path(args.db)
    import hashlib

    digest = hashlib.sha256(Path(args.analytic).read_bytes()).hexdigest()[:12]
    return Path(args.work) / f"simulated-{digest}.sqlite"


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

