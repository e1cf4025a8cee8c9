"""What the data says per problem class: which variant wins, and how far the simple pickers
and cuBLAS fall from best known. Reads the database (with the shipped snapshot loaded); CPU.

    python -m gnn_policy.benchmarks.class_report --db /tmp/r.sqlite --split random-test

Per class of `graphs.classes` (a problem counts in each of its classes) and over all:
- how often each variant (and SPLIT_K > 1) is the best known config;
- the TFLOP/s of `default_config` (as `gnn_policy.matmul` runs it), of the analytic model's
  pick, of the best of the tutorial and Inductor lists, and of each `--policy` checkpoint's
  first pick and best of its first `--k`, over best known (geomean);
- best known over cuBLAS (geomean).
A pick without a correct timing in the database is left out of its cell, which then says on
how many of the class's problems it stands: `collect` measures `default_config` and the lists
on every problem, the analytic pick and the policies' picks only `sweep` does (with the same
`--space` and `--policy` as here).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import hardware_specs
from graphs import GemmProblem
from graphs.classes import CLASSES, classes, split_of
from gnn_policy.baselines import ANALYTIC, analytic_pick, default_pick, fits
from gnn_policy.benchmarks.data_report import geomean
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import NAMED_LISTS, VARIANTS, TileConfig, space

LISTS = ("triton_tutorial", "inductor_mm")


@dataclasses.dataclass(frozen=True)
class Record:
    """One problem: its classes, its best known config and each picker's fraction of it."""

    problem: GemmProblem
    classes: tuple[str, ...]
    best: TileConfig
    fractions: dict[str, float | None]  # method -> its TFLOP/s over best known; None: no correct timing
    best_over_cublas: float | None


def record(problem: GemmProblem, figures: dict[str, float], gpu, model=None, space_name: str = "full",
           policies: dict | None = None, k: int = 4) -> Record | None:
    """The record of one problem from its figures (`Database.tflops`); None without a Triton figure.
    `model`: the analytic model whose pick (in space `space_name`) is looked up (None: that
    column stays empty); `policies`: name -> Policy, each scored by its first pick and the best
    of its first `k` (None where one of those picks has no correct timing)."""
    triton = {k: v for k, v in figures.items() if k != CUBLAS}
    if not triton:
        return None
    best_key = max(triton, key=triton.get)
    best = triton[best_key]
    full = space(space_name)
    picks = {"default_config": default_pick(problem, gpu, fits(full, gpu, problem)),
             "analytic": analytic_pick(problem, gpu, full, model) if model is not None else None}
    fractions: dict[str, float | None] = {m: triton[c.key] / best if c is not None and c.key in triton else None
                                          for m, c in picks.items()}
    for name in LISTS:
        mine = [triton[c.key] for c in NAMED_LISTS[name] if c.key in triton]
        fractions[name] = max(mine) / best if mine else None
    for name, policy in (policies or {}).items():
        got = [triton.get(pick.config.key) for pick in policy.top_k(problem, gpu, k)]
        fractions[name] = got[0] / best if got and got[0] is not None else None
        fractions[f"{name} best of {k}"] = max(got) / best if got and None not in got else None
    cublas = figures.get(CUBLAS)
    return Record(problem, classes(problem), TileConfig.from_key(best_key), fractions,
                  best / cublas if cublas else None)


def records(db: Database, gpu, split: str, model=None, space_name: str = "full", policies: dict | None = None,
            k: int = 4) -> list[Record]:
    """Records of every problem of `split` measured on `gpu` (a GpuSpec); the rest as `record`."""
    out = []
    for p in db.problems(gpu.name):
        if split_of(p) == split and (r := record(p, db.tflops(gpu.name, p.key), gpu, model, space_name,
                                                 policies, k)) is not None:
            out.append(r)
    return out


def _cell(values: list[float | None], total: int) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    return f"{geomean(got):.2f}" + (f" ({len(got)}/{total})" if len(got) < total else "")


def class_table(recs: list[Record]) -> str:
    """Markdown: one row per populated class, then all."""
    seen = {r.best.variant for r in recs}
    variants = list(VARIANTS) + sorted(seen - set(VARIANTS))  # a variant that never wins shows 0%
    methods = list(dict.fromkeys(m for r in recs for m in r.fractions))  # the record's order: simple pickers, lists, policies
    head = (["class", "problems"] + [f"{v} wins" for v in variants] + ["SPLIT_K > 1 wins"]
            + [f"{m} / best" for m in methods] + ["best / cuBLAS"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cls in (*CLASSES, "all"):
        rs = [r for r in recs if cls == "all" or cls in r.classes]
        if not rs:
            continue
        n = len(rs)
        cells = [cls, str(n)] + [f"{sum(r.best.variant == v for r in rs) / n:.0%}" for v in variants]
        cells.append(f"{sum(r.best.split_k > 1 for r in rs) / n:.0%}")
        cells += [_cell([r.fractions.get(m) for r in rs], n) for m in methods]
        cells.append(_cell([r.best_over_cublas for r in rs], n))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(recs: list[Record], gpu: str, split: str) -> str:
    if not recs:
        return f"no measured problems of split {split} on {gpu}"
    lead = (f"{len(recs)} problems of {split} on {gpu}. Wins: the share whose best known config has that "
            "variant. Fractions: geomean over problems of TFLOP/s over best known (a list: its best "
            "config); (n/N): the cell stands on n of the class's N problems.")
    return lead + "\n\n" + class_table(recs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--gpu", default="h200", help="GPU spec name")
    ap.add_argument("--split", default="random-test", help="a family or random split (graphs.classes)")
    ap.add_argument("--analytic", default=str(ANALYTIC),
                    help="fitted analytic model whose pick is looked up ('': skip; about 0.5 s a problem)")
    ap.add_argument("--space", default="full", help="config space the analytic pick is made in (as sweep's)")
    ap.add_argument("--policy", action="append", default=[],
                    help="policy checkpoint whose picks are looked up, as PATH or NAME=PATH (repeatable)")
    ap.add_argument("--k", type=int, default=4, help="the policies' picks whose best is reported too")
    ap.add_argument("--markdown", type=Path, help="also write the report here")
    ns = ap.parse_args(argv)
    gpu = hardware_specs.load(ns.gpu)
    model = None
    if ns.analytic:
        from gnn_policy.measure.simulator import load_fitted

        model = load_fitted(ns.analytic)
    policies = {}
    if ns.policy:
        from gnn_policy.policy import Policy
    for given in ns.policy:
        name, _, path = given.rpartition("=")
        policies[name or Path(path).stem] = Policy.load(path)
    with Database(ns.db) as db:
        load_shipped(db)
        text = report(records(db, gpu, ns.split, model, ns.space, policies, ns.k), gpu.name, ns.split)
    print(text)
    if ns.markdown:
        ns.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
