"""The `gnn-policy` command line: one frozen dataclass per command, its fields are the flags."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Callable, Sequence

import hardware_specs
from graphs.model_config import ConfigError
from gnn_policy.args import add_fields, build, flag
from gnn_policy.checkpoint import CheckpointError
from gnn_policy.collect import CollectArgs
from gnn_policy.confirm import ConfirmArgs
from gnn_policy.export import ExportArgs, ExportError
from gnn_policy.sweep import SweepArgs
from gnn_policy.database import DatabaseError
from gnn_policy.interrupts import EXIT_INTERRUPTED, Interrupted, terminate_as_interrupt
from gnn_policy.inventory import SpecsArgs, StatsArgs, format_table, run_specs, run_stats
from gnn_policy.limits import ProblemTooLarge
from gnn_policy.measure.replay import ReplayError
from gnn_policy.measure.workers import WorkerError
from gnn_policy.model_tune import ModelSpecError
from gnn_policy.snapshot import ShardWriteError
from gnn_policy.tune import TuneArgs, TuneError
from training.bench import BenchArgs
from training.ensemble import EnsembleArgs, EnsembleError
from training.finetune import FinetuneArgs, FinetuneError
from training.imported import ImportedArgs
from training.meta_pretrain import MetaPretrainArgs
from training.pretrain import PretrainArgs
from training.transfer import TransferArgs, TransferError

# What a user can get wrong or run into (a bad file, a full disk, a GPU that is not here): the
# message names the culprit, so it is printed alone, without a traceback.
USER_ERRORS = (hardware_specs.SpecError, DatabaseError, FileNotFoundError, FinetuneError, TransferError,
               CheckpointError, ProblemTooLarge, ReplayError, WorkerError, ShardWriteError, ConfigError, ModelSpecError,
               TuneError, ExportError, EnsembleError)


@dataclasses.dataclass(frozen=True)
class DemoArgs:
    """Run the Triton GEMM on a few problems and check each against torch in float64."""

    seed: int = flag(0, "random seed for the inputs")


def run_imported(args: ImportedArgs) -> int:
    from collections import Counter

    from training.imported import load_demonstrations

    demos, report = load_demonstrations(args.root)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
        return 0
    exact = Counter(d.gpu for d in demos if d.exact)
    problems = {gpu: len({d.problem.key for d in demos if d.gpu == gpu}) for gpu in report.demonstrations}
    rows = [(gpu, report.files_used[gpu], n, exact[gpu], n - exact[gpu], problems[gpu])
            for gpu, n in report.demonstrations.most_common()]
    print(format_table(("gpu", "files", "demonstrations", "exact", "mapped", "problems"), rows))

    def top(counts: Counter) -> str:
        items = ", ".join(f"{k}: {v}" for k, v in counts.most_common(6))
        return f" ({items}{', ...' if len(counts) > 6 else ''})" if counts else ""

    why = {"dtype": "not a 16-bit dtype", "gpu": "no GPU spec", "model": "no known model with these E, N"}
    print(f"\n{report.files} files, {report.duplicates} duplicates read once")
    for reason, counts in report.skipped.items():
        print(f"skipped, {why[reason]}: {sum(counts.values())} files{top(counts)}")
    print(f"configs: {report.exact} exact, {report.mapped} mapped{top(report.mapped_why)}, "
          f"{sum(report.dropped.values())} dropped{top(report.dropped)}")
    return 0


def run_demo(args: DemoArgs) -> int:
    import torch

    if not torch.cuda.is_available():
        # Must precede the first import of the kernels (their @jit decorators read it).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from gnn_policy.demo import demo

    return demo(args.seed)


def run_collect(args: CollectArgs) -> int:
    from gnn_policy.collect import run

    counts = run(args)
    print(json.dumps(counts, sort_keys=True))
    return 0


def run_sweep(args: SweepArgs) -> int:
    from gnn_policy.sweep import run

    print(json.dumps(run(args), sort_keys=True))
    return 0


def run_pretrain(args: PretrainArgs) -> int:
    from training.pretrain import run  # Lightning loads only for the commands that train

    card = run(args)
    if card is not None:  # None: a DDP rank other than 0
        print(json.dumps(card["metrics"], indent=1))
    return 0


def run_meta_pretrain(args: MetaPretrainArgs) -> int:
    from training.meta_pretrain import run
    from training.tasks import TaskError

    try:
        card = run(args)
    except TaskError as exc:  # defined beside the tasks, which import torch: caught here, not in main
        print(f"gnn-policy meta-pretrain: {exc}", file=sys.stderr)
        return 2
    if card is not None:  # None: a DDP rank other than 0
        print(json.dumps(card["metrics"], indent=1))
    return 0


def _print_report(out: dict) -> int:
    """A job's markdown report, then the rest of its result as one JSON line."""
    print(out.pop("report"))
    print(json.dumps(out, sort_keys=True))
    return 0


def run_bench(args: BenchArgs) -> int:
    from training.bench import run

    return _print_report(run(args))


def run_finetune(args: FinetuneArgs) -> int:
    from graphs.model_config import ConfigError
    from gnn_policy.model_tune import ModelSpecError
    from training.finetune import run
    from training.finetune_report import table

    try:
        card = run(args)
    except (ConfigError, ModelSpecError) as exc:  # --model's: a config field or a module:function
        print(f"gnn-policy finetune: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(card, indent=1) if args.json else table(card))
    return 0


def run_transfer(args: TransferArgs) -> int:
    from training.transfer import run

    return _print_report(run(args))


def run_tune(args: TuneArgs) -> int:
    from gnn_policy.model_tune import table as model_table
    from gnn_policy.tune import run, table

    out = run(args)
    print(json.dumps(out, indent=1) if args.json else (model_table if args.model else table)(out))
    return 0


def run_export(args: ExportArgs) -> int:
    from gnn_policy.export import run

    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{args.format} configs for {out['gpu']} from {out['source']}:")
    for name, keys in out["written"].items():
        what = "token count" if args.format == "vllm" else "problem"
        print(f"  {name}: {len(keys)} {what}{'' if len(keys) == 1 else 's'}")
    for s in out["skipped"]:
        print(f"skipped: {s['what']}: {s['why']}")
    return 0


def run_ensemble(args: EnsembleArgs) -> int:
    from training.ensemble import run

    out = run(args)
    print(f"ensemble of {len(out['members'])} written to {out['checkpoint']} (card {out['card']}); fit its "
          f"calibration: python -m gnn_policy.benchmarks.calibrate --db DB --checkpoint {out['checkpoint']}")
    return 0


def run_confirm(args: ConfirmArgs) -> int:
    from gnn_policy.confirm import run

    print(json.dumps(run(args), sort_keys=True))
    return 0


COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {
    "collect": (CollectArgs, run_collect),
    "confirm": (ConfirmArgs, run_confirm),
    "sweep": (SweepArgs, run_sweep),
    "pretrain": (PretrainArgs, run_pretrain),
    "meta-pretrain": (MetaPretrainArgs, run_meta_pretrain),
    "ensemble": (EnsembleArgs, run_ensemble),
    "tune": (TuneArgs, run_tune),
    "export": (ExportArgs, run_export),
    "bench": (BenchArgs, run_bench),
    "finetune": (FinetuneArgs, run_finetune),
    "transfer": (TransferArgs, run_transfer),
    "specs": (SpecsArgs, run_specs),
    "demo": (DemoArgs, run_demo),
    "stats": (StatsArgs, run_stats),
    "imported": (ImportedArgs, run_imported),
}


def parse(argv: Sequence[str] | None = None) -> tuple[str, Any]:
    """The command's name and its options; a bad value exits with argparse's usage error (2)."""
    parser = argparse.ArgumentParser(prog="gnn-policy", description="A learned autotuner for Triton GEMM kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name, (cls, _) in COMMANDS.items():
        commands[name] = sub.add_parser(name, help=cls.__doc__, description=cls.__doc__)
        add_fields(commands[name], cls)
    ns = vars(parser.parse_args(argv))
    name = ns.pop("command")
    cls = COMMANDS[name][0]
    try:
        if ns.get("config"):  # a JSON file of the command's fields, under the flags given
            given = {k for k, v in ns.items() if v is not None}
            ns.update({k: v for k, v in _config(ns["config"], cls).items() if k not in given})
        return name, build(cls, ns)
    except ValueError as exc:  # a --config file's, or one that reads several flags (`__post_init__`)
        commands[name].error(str(exc))


def _config(path: str, cls: type) -> dict[str, Any]:
    """The fields a --config JSON file sets; ValueError naming the file for anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            fields = json.load(f)
    except (OSError, ValueError) as exc:  # a missing file, bytes that are not text, not JSON
        raise ValueError(f"--config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"--config {path}: expected a JSON object of the command's fields")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"--config {path}: unknown fields {unknown} (the fields are the flags, - written _)")
    return fields


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`'s writer


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a user's error or an interrupt is one line on stderr, never a traceback."""
    prog = "gnn-policy"
    try:
        with terminate_as_interrupt():
            name, args = parse(argv)
            prog = f"gnn-policy {name}"
            return COMMANDS[name][1](args)
    except Interrupted as exc:
        print(f"{prog}: interrupted: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader closed the pipe (`gnn-policy specs | head`): stop quietly
        # stdout's buffer would fail again when Python flushes it at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
