"""What the measured data says: cuBLAS and the named config lists against best known, how
often split-K wins, how many configs are ever best, and how far one shape's best config falls
on its neighbours. Reads the database (with the shipped snapshot loaded); no GPU needed.

    python -m gnn_policy.benchmarks.data_report --db /tmp/m.sqlite --markdown docs/data/data_report.md \
        --csv docs/data/data_report.csv --png docs/data/data_report.png
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from graphs import GemmProblem
from graphs.suite import M_GRID
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.snapshot import load_shipped
from gnn_policy.space import NAMED_LISTS, TileConfig

CLASSES = ("decode (M <= 64)", "skinny-K (K <= 1024)", "square", "prefill")
LISTS = tuple(NAMED_LISTS)
NAMED_KEYS = {name: {c.key for c in cs} for name, cs in NAMED_LISTS.items()}
ANY_NAMED = set().union(*NAMED_KEYS.values())


def problem_class(p: GemmProblem) -> str:
    """Decode-like small M first; then skinny K; square when M, N, K are within 2x; else prefill."""
    if p.m <= 64:
        return CLASSES[0]
    if p.k <= 1024:
        return CLASSES[1]
    if max(p.m, p.n, p.k) <= 2 * min(p.m, p.n, p.k):
        return CLASSES[2]
    return CLASSES[3]


# where the held-out policies' first pick is weak: the slices' real rows cover problems of at most 100 GFLOP
SIZE_GROUPS = {"GFLOP <= 100": lambda p: p.flops <= 100e9, "GFLOP > 100": lambda p: p.flops > 100e9,
               "M <= 64": lambda p: p.m <= 64, "M > 64": lambda p: p.m > 64}


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def per_problem(db: Database, gpu: str) -> list[dict]:
    """One record per problem: best known, cuBLAS and each list's best, as TFLOP/s and fractions."""
    out = []
    for p in db.problems(gpu):
        figs = db.tflops(gpu, p.key)
        triton = {k: v for k, v in figs.items() if k != CUBLAS}
        if not triton:
            continue
        best_key = max(triton, key=triton.get)
        rec = {"problem": p.key, "model": p.model, "class": problem_class(p), "m": p.m, "n": p.n, "k": p.k,
               "dtype": p.dtype, "best_config": best_key, "best_tflops": triton[best_key],
               "configs": len(triton), "cublas": figs.get(CUBLAS, float("nan")) / triton[best_key]}
        for name in LISTS:
            mine = [v for k, v in triton.items() if k in NAMED_KEYS[name]]
            rec[name] = max(mine) / triton[best_key] if mine else float("nan")
        sample = [v for k, v in triton.items() if k not in ANY_NAMED]
        rec["random_sample"] = max(sample) / triton[best_key] if sample else float("nan")
        rec["_figs"], rec["_problem"] = triton, p
        out.append(rec)
    return out


def class_table(recs: list[dict]) -> str:
    cols = ("cublas", *LISTS, "random_sample")
    lines = ["| class | problems | best known TFLOP/s (geomean) | "
             + " | ".join(f"{c} / best" for c in cols) + " | best / cuBLAS |",
             "|---|---|---|" + "---|" * (len(cols) + 1)]
    for cls in (*CLASSES, "all"):
        rs = [r for r in recs if cls in ("all", r["class"])]
        if not rs:
            continue
        fr = [geomean([r[c] for r in rs if not math.isnan(r[c])]) for c in cols]
        lines.append(f"| {cls} | {len(rs)} | {geomean([r['best_tflops'] for r in rs]):.0f} | "
                     + " | ".join(f"{x:.2f}" for x in fr) + f" | {1 / fr[0]:.2f} |")
    return "\n".join(lines)


def winners_table(recs: list[dict]) -> str:
    lines = ["| class | problems | best has SPLIT_K > 1 | best uses TMA loads | distinct best configs |",
             "|---|---|---|---|---|"]
    for cls in (*CLASSES, "all"):
        rs = [r for r in recs if cls in ("all", r["class"])]
        if not rs:
            continue
        best = [TileConfig.from_key(r["best_config"]) for r in rs]
        lines.append(f"| {cls} | {len(rs)} | {sum(c.split_k > 1 for c in best)} ({sum(c.split_k > 1 for c in best) / len(rs):.0%}) "
                     f"| {sum(c.variant == 'tma' for c in best) / len(rs):.0%} | {len({c.key for c in best})} |")
    return "\n".join(lines)


def neighbour_pairs(recs: list[dict]) -> list[tuple[int, float]]:
    """(distance in M-grid steps, fraction of q's best known that p's best config reaches on q)
    for problems p, q of one layer computation (N, K, dtype, epilogue) at other M, where q has
    p's best config measured."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in recs:
        p = r["_problem"]
        groups[(p.n, p.k, p.batch, p.dtype, p.bias, p.activation, p.residual)].append(r)
    pairs = []
    for members in groups.values():
        for a in members:
            for b in members:
                if a is b or a["m"] not in M_GRID or b["m"] not in M_GRID:
                    continue
                got = b["_figs"].get(a["best_config"])
                if got is not None:
                    dist = abs(M_GRID.index(a["m"]) - M_GRID.index(b["m"]))
                    pairs.append((dist, got / b["best_tflops"]))
    return pairs


def neighbour_table(pairs: list[tuple[int, float]]) -> str:
    lines = ["| M-grid steps apart | pairs | geomean fraction of the neighbour's best | worst | below 0.9 |",
             "|---|---|---|---|---|"]
    for lo, hi, label in ((1, 1, "1 (M x2)"), (2, 2, "2 (M x4)"), (3, 4, "3-4"), (5, 99, "5+")):
        fr = [f for d, f in pairs if lo <= d <= hi]
        if fr:
            lines.append(f"| {label} | {len(fr)} | {geomean(fr):.2f} | {min(fr):.2f} | {sum(f < 0.9 for f in fr) / len(fr):.0%} |")
    return "\n".join(lines)


def plot(recs: list[dict], pairs: list[tuple[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for col, marker in (("cublas", "o"), ("triton_tutorial", "s"), ("inductor_mm", "^"), ("seed", "x")):
        xs = [r["m"] for r in recs if not math.isnan(r[col])]
        ax1.scatter(xs, [r[col] for r in recs if not math.isnan(r[col])], marker=marker, label=col, alpha=0.7)
    ax1.set_xscale("log", base=2)
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set(xlabel="M (tokens)", ylabel="TFLOP/s / best known", title="cuBLAS and named lists vs best known")
    ax1.legend()
    steps = sorted({d for d, _ in pairs})
    ax2.boxplot([[f for d, f in pairs if d == s] for s in steps], positions=steps)
    ax2.set(xlabel="M-grid steps between the two shapes (1 = M x2)", ylabel="fraction of the neighbour's best known",
            title="one shape's best config, run on the same layer at another M")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(recs: list[dict], pairs: list[tuple[int, float]], gpu: str) -> str:
    return "\n\n".join([
        f"{len(recs)} problems on {gpu}; fractions are geomeans over problems of TFLOP/s over best known "
        "(a list's best among its configs valid for the problem; `random_sample`: the best of the "
        "stratified random configs, named lists excluded).",
        class_table(recs), winners_table(recs), neighbour_table(pairs)])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--gpu", default="H200-SXM-141GB")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--png", type=Path)
    ns = ap.parse_args(argv)
    with Database(ns.db) as db:
        load_shipped(db)
        recs = per_problem(db, ns.gpu)
    pairs = neighbour_pairs(recs)
    text = report(recs, pairs, ns.gpu)
    print(text)
    if ns.markdown:
        ns.markdown.write_text(text + "\n")
    if ns.csv:
        with ns.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[k for k in recs[0] if not k.startswith("_")], extrasaction="ignore")
            w.writeheader()
            w.writerows(recs)
    if ns.png:
        plot(recs, pairs, ns.png)


if __name__ == "__main__":
    main()
