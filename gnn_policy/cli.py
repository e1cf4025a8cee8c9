"""The `gnn-policy` command line: one frozen dataclass per command, its fields are the flags."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Callable, Sequence

import hardware_specs
from gnn_policy.args import add_fields, build, flag
from gnn_policy.collect import CollectArgs
from gnn_policy.confirm import ConfirmArgs
from gnn_policy.export import ExportArgs
from gnn_policy.sweep import SweepArgs
from gnn_policy.tune import TuneArgs
from training.bench import BenchArgs
from training.finetune import FinetuneArgs, FinetuneError
from training.imported import ImportedArgs
from training.meta_pretrain import MetaPretrainArgs
from training.pretrain import PretrainArgs
from training.transfer import TransferArgs, TransferError
from gnn_policy.database import DEFAULT_PATH, DatabaseError


@dataclasses.dataclass(frozen=True)
class SpecsArgs:
    """Print the GPU specs this project knows (hardware_specs/*.yaml)."""

    json: bool = flag(False, "print a JSON list of objects with the YAML's field names")
    space: bool = flag(False, "print how many configs of each space are valid per GPU and dtype")
    gpu: tuple[str, ...] = flag(("h200", "a100"), "GPUs for --space (repeatable)", action="append")


@dataclasses.dataclass(frozen=True)
class StatsArgs:
    """Count the measurements in a database (with the shipped snapshot loaded): per GPU, source, status and split."""

    db: str = flag(str(DEFAULT_PATH), "the SQLite database ($GNN_POLICY_DB)")
    json: bool = flag(False, "print JSON: gpus -> name -> {real_ok, real_failed, problems, configs}, and "
                             "splits -> name -> split -> {problems, real_ok, real_failed}")


@dataclasses.dataclass(frozen=True)
class DemoArgs:
    """Run the Triton GEMM on a few problems and check each against torch in float64."""

    seed: int = flag(0, "random seed for the inputs")


def specs_table(names: Sequence[str]) -> str:
    cols = ("name", "arch", "SMs", "L2 MiB", "smem/block KiB", "HBM GB/s", "MHz", "bf16 TF", "fp8 TF",
            "TMA", "wgmma")
    rows = []
    for name in names:
        s = hardware_specs.load(name)
        rows.append((s.name, s.architecture, s.sm_count, f"{s.l2_bytes / 2**20:.0f}",
                     f"{s.smem_per_block_bytes / 1024:.0f}", f"{s.memory_bandwidth_gbps:.0f}",
                     s.sm_clock_mhz, f"{s.peak('bf16'):.0f}", f"{s.peak('fp8'):.0f}",
                     "yes" if s.has("tma") else "no", "yes" if s.has("wgmma") else "no"))
    return _format(cols, rows)


def space_table(gpus: Sequence[str]) -> str:
    from gnn_policy.space import NAMED_LISTS, SPACES, violations

    cols = ("gpu", "dtype", *(f"{n} ({len(s)})" for n, s in SPACES.items()),
            *(f"{n} ({len(c)})" for n, c in NAMED_LISTS.items() if n not in SPACES))
    rows = []
    for name in gpus:
        gpu = hardware_specs.load(name)
        for dtype in ("bf16", "fp16", "fp32"):
            counts = [sum(not violations(c, gpu, dtype) for c in s) for s in SPACES.values()]
            counts += [sum(not violations(c, gpu, dtype) for c in cs)
                       for n, cs in NAMED_LISTS.items() if n not in SPACES]
            rows.append((gpu.name, dtype, *counts))
    return _format(cols, rows)


def _format(cols: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, cols))] + [[str(x) for x in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_specs(args: SpecsArgs) -> int:
    names = hardware_specs.available()
    if args.json:
        print(json.dumps([hardware_specs.load(n).as_dict() for n in names], indent=1))
    else:
        print(specs_table(names))
    if args.space:
        print()
        print("valid configs per space (size in brackets), rules of gnn_policy.space.violations:")
        print(space_table(args.gpu))
    return 0


def run_stats(args: StatsArgs) -> int:
    import time

    from gnn_policy.database import Database
    from gnn_policy.snapshot import load_shipped, pending

    with Database(os.path.expanduser(args.db)) as db:
        todo = pending(db)
        if todo:  # the first use of a database: loading takes a while, so say what is happening
            print(f"gnn-policy stats: loading {len(todo)} shards of the shipped snapshot into {args.db} "
                  "(once per database)...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            rows = load_shipped(db)
            print(f"gnn-policy stats: loaded {rows} rows in {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
        stats = db.stats()
        splits = {gpu: split_counts(db.problem_counts(gpu)) for gpu in stats["gpus"]}
    if args.json:
        print(json.dumps({"gpus": stats["gpus"], "splits": splits}, indent=1))
        return 0
    rows = [(name, s["real_ok"], s["real_failed"], s["problems"], s["configs"],
             ", ".join(f"{k}: {v}" for k, v in stats["by_source_status"][name].items()))
            for name, s in stats["gpus"].items()]
    print(_format(("gpu", "real ok", "real failed", "problems", "configs", "rows by source/status"), rows))
    rows = [(gpu, name, c["problems"], c["real_ok"], c["real_failed"]) for gpu, per in splits.items()
            for name, c in per.items()]
    print()
    print(_format(("gpu", "split", "problems", "real ok", "real failed"), rows))
    return 0


def split_counts(counts: Sequence[tuple[Any, int, int]]) -> dict[str, dict[str, int]]:
    """Per split (graphs.classes.ALL_SPLITS order, empty ones left out): problems and real rows."""
    from graphs.classes import ALL_SPLITS, split_of

    out = {name: {"problems": 0, "real_ok": 0, "real_failed": 0} for name in ALL_SPLITS}
    for problem, ok, failed in counts:
        c = out[split_of(problem)]
        c["problems"] += 1
        c["real_ok"] += ok
        c["real_failed"] += failed
    return {name: c for name, c in out.items() if c["problems"]}


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
    print(_format(("gpu", "files", "demonstrations", "exact", "mapped", "problems"), rows))

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
    from training.finetune import run

    print(json.dumps(run(args), indent=1))
    return 0


def run_transfer(args: TransferArgs) -> int:
    from training.transfer import run

    return _print_report(run(args))


def run_tune(args: TuneArgs) -> int:
    from graphs.model_config import ConfigError
    from gnn_policy.model_tune import ModelSpecError, table as model_table
    from gnn_policy.tune import TuneError, run, table

    try:
        out = run(args)
    except (ConfigError, ModelSpecError, TuneError) as exc:
        print(f"gnn-policy tune: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1) if args.json else (model_table if args.model else table)(out))
    return 0


def run_export(args: ExportArgs) -> int:
    from graphs.model_config import ConfigError
    from gnn_policy.export import ExportError, run
    from gnn_policy.model_tune import ModelSpecError

    try:
        out = run(args)
    except (ConfigError, ModelSpecError, ExportError) as exc:
        print(f"gnn-policy export: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{args.format} configs for {out['gpu']} from {out['source']}:")
    for name, keys in out["written"].items():
        print(f"  {name}: {len(keys)} {'token counts' if args.format == 'vllm' else 'problems'}")
    for s in out["skipped"]:
        print(f"skipped: {s['what']}: {s['why']}")
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
    parser = argparse.ArgumentParser(prog="gnn-policy", description="A learned autotuner for Triton GEMM kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (cls, _) in COMMANDS.items():
        add_fields(sub.add_parser(name, help=cls.__doc__, description=cls.__doc__), cls)
    ns = vars(parser.parse_args(argv))
    name = ns.pop("command")
    if ns.get("config"):  # a JSON file of the command's fields, under the flags given
        given = {k for k, v in ns.items() if v is not None}
        with open(ns["config"]) as f:
            ns.update({k: v for k, v in json.load(f).items() if k not in given})
    return name, build(COMMANDS[name][0], ns)


def main(argv: Sequence[str] | None = None) -> int:
    name, args = parse(argv)
    try:
        return COMMANDS[name][1](args)
    except (hardware_specs.SpecError, DatabaseError, FileNotFoundError, FinetuneError,
            TransferError) as exc:
        print(f"gnn-policy {name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
