"""`gnn-policy specs` and `gnn-policy stats`: what the project knows, as tables. The GPU specs and
how many configs of each space are valid on them; the measurements a database holds, per GPU,
source, status and split. `format_table` lays out their tables and `imported`'s.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Sequence

import hardware_specs
from gnn_policy.args import flag
from gnn_policy.database import DEFAULT_PATH


@dataclasses.dataclass(frozen=True)
class SpecsArgs:
    """Print the GPU specs this project knows (hardware_specs/*.yaml)."""

    json: bool = flag(False, "print a JSON list of objects with the YAML's field names")
    space: bool = flag(False, "print how many configs of each space are valid per GPU and dtype")
    gpu: tuple[str, ...] = flag(("h200", "a100"), "GPUs for --space (repeatable)", action="append")


@dataclasses.dataclass(frozen=True)
class StatsArgs:
    """Count the measurements in a database (with the shipped snapshot loaded): per GPU, source, status and split."""

    db: str = flag(str(DEFAULT_PATH), "the SQLite database ($GNN_POLICY_DB); only this default one is created "
                                      "(and filled from the shipped snapshot) when missing")
    json: bool = flag(False, "print JSON: gpus -> name -> {real_ok, real_failed, problems, configs}, and "
                             "splits -> name -> split -> {problems, real_ok, real_failed}")


def specs_table(names: Sequence[str]) -> str:
    """One row per GPU spec: the figures the policy reads most."""
    cols = ("name", "arch", "SMs", "L2 MiB", "smem/block KiB", "HBM GB/s", "MHz", "bf16 TF", "fp8 TF",
            "TMA", "wgmma")
    rows = []
    for name in names:
        s = hardware_specs.load(name)
        rows.append((s.name, s.architecture, s.sm_count, f"{s.l2_bytes / 2**20:.0f}",
                     f"{s.smem_per_block_bytes / 1024:.0f}", f"{s.memory_bandwidth_gbps:.0f}",
                     s.sm_clock_mhz, f"{s.peak('bf16'):.0f}", f"{s.peak('fp8'):.0f}",
                     "yes" if s.has("tma") else "no", "yes" if s.has("wgmma") else "no"))
    return format_table(cols, rows)


def space_table(gpus: Sequence[str]) -> str:
    """Valid configs of each space and named list, per GPU and dtype."""
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
    return format_table(cols, rows)


def format_table(cols: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, a rule under the header."""
    cells = [list(map(str, cols))] + [[str(x) for x in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_specs(args: SpecsArgs) -> int:
    names = hardware_specs.available()
    space = space_table(args.gpu) if args.space else ""  # a bad --gpu fails before anything is printed
    if args.json:
        print(json.dumps([hardware_specs.load(n).as_dict() for n in names], indent=1))
    else:
        print(specs_table(names))
    if args.space:
        print()
        print("valid configs per space (size in brackets), rules of gnn_policy.space.violations:")
        print(space)
    return 0


def run_stats(args: StatsArgs) -> int:
    import time
    from pathlib import Path

    from gnn_policy.database import Database, read_only_reason
    from gnn_policy.snapshot import load_shipped, unloaded

    path = Path(os.path.expanduser(args.db))
    read_only = path.exists() and read_only_reason(path)
    # only the default database is made here: a mistyped --db must not leave an empty one behind
    with Database(path, create=path == DEFAULT_PATH, readonly=bool(read_only)) as db:
        missing = unloaded(db)
        if read_only and missing:
            print(f"gnn-policy stats: {path} is read-only ({read_only}): {len(missing)} shards not loaded "
                  "into it are not counted", file=sys.stderr)
        elif missing:  # the first use of a database: loading takes a while, so say what is happening
            print(f"gnn-policy stats: loading {len(missing)} shards of the shipped snapshot into {path} "
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
    print(format_table(("gpu", "real ok", "real failed", "problems", "configs", "rows by source/status"), rows))
    rows = [(gpu, name, c["problems"], c["real_ok"], c["real_failed"]) for gpu, per in splits.items()
            for name, c in per.items()]
    print()
    print(format_table(("gpu", "split", "problems", "real ok", "real failed"), rows))
    return 0


def split_counts(counts: Sequence[tuple[Any, int, int]]) -> dict[str, dict[str, int]]:
    """Per split (graphs.classes.ALL_SPLITS order, empty ones left out): problems and real rows, of
    `Database.problem_counts` (problems with real rows: one only simulated is not counted)."""
    from graphs.classes import ALL_SPLITS, split_of

    out = {name: {"problems": 0, "real_ok": 0, "real_failed": 0} for name in ALL_SPLITS}
    for problem, ok, failed in counts:
        c = out[split_of(problem)]
        c["problems"] += 1
        c["real_ok"] += ok
        c["real_failed"] += failed
    return {name: c for name, c in out.items() if c["problems"]}
