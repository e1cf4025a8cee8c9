"""What the dense sweeps, the re-timings and the SM-slice rows say, from the shipped data (CPU).

    python -m gnn_policy.benchmarks.sweeps --db /tmp/r.sqlite

- Dense sweeps: per densely swept test problem, best known from the configs of the sparse
  plan (`collect`'s defaults: 200 stratified configs of the 1,000 pool and the lists) over
  best known from every measured config.
- Re-timings (`confirm`): the median of a config's re-timings over its first timing.
- Slices: on (problem, config) pairs measured on both, the slice's time over the full GPU's,
  and how the full GPU's best config does on the slice.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

import hardware_specs
from gnn_policy.benchmarks.data_report import geomean
from gnn_policy.collect import CollectArgs, plan, select_problems
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.snapshot import load_shipped


def _quantiles(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else xs * 9
    return {"n": len(xs), "median": round(statistics.median(xs), 3), "p10": round(q[0], 3), "p90": round(q[-1], 3)}


def dense_gain(db: Database, gpu, dense: int, min_configs: int = 1000) -> dict:
    """Sparse-plan best known over dense best known, on the test problems swept densely."""
    problems = select_problems("test", dense, 0)
    # the plan as the sparse collection ran it, before default_config joined the lists
    sparse = {p.key: {c.key for c in cs if c is not None}
              for p, cs in plan(problems, gpu, CollectArgs(db="", default=False))}
    ratios, sizes, vs_cublas = [], [], []
    for p in problems:
        tf = db.tflops(gpu.name, p.key)
        cublas = tf.pop(CUBLAS, None)
        if len(tf) < min_configs:
            continue
        best = max(tf.values())
        ratios.append(max(v for k, v in tf.items() if k in sparse[p.key]) / best)
        sizes.append(len(tf))
        if cublas:
            vs_cublas.append(best / cublas)
    if not ratios:
        return {"problems": 0}
    return {"problems": len(ratios), "median_configs": statistics.median(sizes),
            "sparse_over_dense_geomean": round(geomean(ratios), 3), "worst": round(min(ratios), 3),
            "share_gaining_over_2pct": round(sum(r < 0.98 for r in ratios) / len(ratios), 2),
            "dense_best_over_cublas_geomean": round(geomean(vs_cublas), 3) if vs_cublas else None}


def retimes(db: Database, rows: list[dict], gpu: str) -> dict:
    first = {(r["problem"], r["config"]): r["median_ms"] for r in rows if r["gpu"] == gpu}
    again: dict[tuple, list[float]] = defaultdict(list)
    for r in db.retimes_after(0):
        if r["gpu"] == gpu and r["status"] == "ok":
            again[(r["problem"], r["config"])].append(r["median_ms"])
    ratio = {k: statistics.median(v) / first[k] for k, v in again.items() if k in first}
    out = {}
    for name, keep in (("triton", lambda c: c != CUBLAS), ("cublas", lambda c: c == CUBLAS)):
        xs = [v for (_, c), v in ratio.items() if keep(c)]
        if xs:
            out[name] = _quantiles(xs)
    return out


def slices(rows: list[dict], full: str, min_shared: int = 50) -> dict:
    by_gpu: dict[str, dict] = defaultdict(lambda: defaultdict(dict))
    for r in (r for r in rows if r["config"] != CUBLAS):
        by_gpu[r["gpu"]][r["problem"]][r["config"]] = (r["median_ms"], r["problem_fields"]["m"])
    out = {}
    full_sms, base = hardware_specs.load(full).sm_count, by_gpu[full]
    for name, problems in by_gpu.items():
        spec = hardware_specs.load(name)
        if spec.slice_of is None:
            continue
        slower, slower_large, kept = [], [], []
        for p, configs in problems.items():
            shared = [c for c in configs if c in base.get(p, {})]
            for c in shared:
                (ms, m), full_ms = configs[c], base[p][c][0]
                slower.append(ms / full_ms)
                if m >= 1024:
                    slower_large.append(ms / full_ms)
            if len(shared) >= min_shared:
                full_best = min(shared, key=lambda c: base[p][c][0])
                kept.append(min(configs[c][0] for c in shared) / configs[full_best][0])
        out[name] = {"sm_count": spec.sm_count, "sm_ratio": round(full_sms / spec.sm_count, 2),
                     "rows": sum(len(c) for c in problems.values()), "problems": len(problems),
                     "shared_pairs": len(slower),
                     "slice_over_full_time_median": round(statistics.median(slower), 2) if slower else None,
                     "at_m_1024_plus": round(statistics.median(slower_large), 2) if slower_large else None,
                     "full_best_on_slice_over_slice_best": {"problems": len(kept),
                                                            "geomean": round(geomean(kept), 3) if kept else None,
                                                            "worst": round(min(kept), 3) if kept else None}}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--dense", type=int, default=40, help="test problems swept densely (collection order)")
    ns = ap.parse_args(argv)
    gpu = hardware_specs.load(ns.gpu)
    with Database(ns.db) as db:
        load_shipped(db)
        rows = [r for r in db.rows_after(0) if r["status"] == "ok" and r["source"] == "real"]  # read once
        report = {"dense_sweeps": dense_gain(db, gpu, ns.dense), "retimes": retimes(db, rows, gpu.name),
                  "slices": slices(rows, gpu.name)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
