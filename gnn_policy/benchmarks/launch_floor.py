"""The launch floor: the least time one kernel takes, measured on the shipped real rows (CPU).

    python -m gnn_policy.benchmarks.launch_floor --db /tmp/r.sqlite \\
        --png docs/data/launch_floor.png --out docs/data/launch_floor.json

Timings are CUDA-graph replays (`gnn_policy.measure.timing`), so a kernel costs at least its
launch and one minimal CTA's round trip to memory, however little work it has; the FLOPs and
bytes roofline ignores that. For each GPU (slices included) this reports:
- `fastest`: the smallest per-call median of any correct Triton config and of cuBLAS, and the
  1st percentile of the best-known times of problems whose roofline work is under 1 us;
- `by_work`: best-known time against the roofline's work time, in bins (the PNG plots it);
- `forms`: on the training role alone (`graphs.classes.ROLES`), how well `max(work, t0)` and
  `work + t0` fit the best-known times, for several floors t0 and for the largest t0 each
  form allows without a training problem below it. The form is chosen here, never on the
  held-out splits;
- `rows_below_bound`: real rows (Triton and cuBLAS, every split) faster than the bound, with
  no floor, with the spec's floor as a max and as a sum (`calibration.roofline_us`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

import hardware_specs
from graphs import GemmProblem
from graphs.classes import ROLES, split_of
from gnn_policy.calibration import roofline_us
from gnn_policy.database import Database
from gnn_policy.db_schema import problem_from_fields
from gnn_policy.measure.result import CUBLAS
from gnn_policy.snapshot import load_shipped

FLOORS_US = (1.0, 2.0, 2.5, 3.0, 3.5)  # floors the two forms are compared at
BINS_US = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, math.inf)  # roofline work time bins
SMALL_US = 1.0  # "the smallest problems": roofline work under this


@dataclasses.dataclass(frozen=True)
class Best:
    """One (GPU, problem): its fastest correct Triton config and cuBLAS, and the roofline's work."""

    gpu: str
    problem: GemmProblem
    split: str
    triton_us: float
    cublas_us: float  # inf where cuBLAS was not measured
    work_us: float  # `roofline_us` without the floor


def real_rows(db: Database) -> list[dict]:
    """Every correct real row: gpu, problem, config key and per-call median in microseconds."""
    return [{"gpu": r["gpu"], "problem": problem_from_fields(r["problem_fields"]), "config": r["config"],
             "us": r["median_ms"] * 1e3}
            for r in db.rows_after(0) if r["status"] == "ok" and r["source"] == "real"]


def bests(rows: list[dict]) -> list[Best]:
    """The best-known Triton time and cuBLAS's of every (GPU, problem) with a Triton row."""
    fastest: dict[tuple[str, str], dict] = {}
    for r in rows:
        slot = fastest.setdefault((r["gpu"], r["problem"].key), {"p": r["problem"], CUBLAS: math.inf, "t": math.inf})
        kind = CUBLAS if r["config"] == CUBLAS else "t"
        slot[kind] = min(slot[kind], r["us"])
    specs = {g: hardware_specs.load(g) for g, _ in fastest}
    return [Best(g, s["p"], split_of(s["p"]), s["t"], s[CUBLAS], roofline_us(s["p"], specs[g], floor=False))
            for (g, _), s in fastest.items() if math.isfinite(s["t"])]


def fastest(rows: list[dict], best: list[Best], gpu: str) -> dict:
    """The smallest per-call times measured on `gpu` (see the module docstring)."""
    out: dict = {}
    for name, kind in (("triton", lambda c: c != CUBLAS), ("cublas", lambda c: c == CUBLAS)):
        mine = [r for r in rows if r["gpu"] == gpu and kind(r["config"])]
        if mine:
            r = min(mine, key=lambda r: r["us"])
            out[name] = {"us": round(r["us"], 3), "problem": r["problem"].key, "config": r["config"],
                         "split": split_of(r["problem"]), "rows": len(mine)}
    small = [b.triton_us for b in best if b.gpu == gpu and b.work_us < SMALL_US]
    if small:
        out["small_problems"] = {"work_under_us": SMALL_US, "problems": len(small),
                                 "best_known_p1_us": round(float(np.percentile(small, 1)), 3),
                                 "best_known_median_us": round(float(np.median(small)), 3)}
    return out


def by_work(best: list[Best]) -> list[dict]:
    """Best-known time against the roofline's work time, per bin of the latter."""
    out = []
    for lo, hi in zip(BINS_US, BINS_US[1:]):
        part = [b for b in best if lo <= b.work_us < hi]
        if part:
            t = np.array([b.triton_us for b in part])
            gap = t - np.array([b.work_us for b in part])
            out.append({"work_us": f"{lo:g}-{hi:g}", "problems": len(part), "best_min_us": round(t.min(), 2),
                        "best_median_us": round(float(np.median(t)), 2), "best_minus_work_min_us": round(gap.min(), 2),
                        "best_minus_work_median_us": round(float(np.median(gap)), 2)})
    return out


def bound_us(work: np.ndarray, floor: float, form: str) -> np.ndarray:
    """The bound of one form: `max` (work or the floor) or `sum` (work after the floor)."""
    return np.maximum(work, floor) if form == "max" else work + floor


def fit(best: list[Best], floor: float, form: str) -> dict:
    """How a bound fits best-known times: median |log(best / bound)|, share within 20%, and the
    problems faster than it (a bound must have none)."""
    t, work = np.array([b.triton_us for b in best]), np.array([b.work_us for b in best])
    logs = np.log(t / bound_us(work, floor, form))
    return {"median_abs_log": round(float(np.median(np.abs(logs))), 3),
            "within_20pct": round(float(np.mean(np.abs(np.exp(logs) - 1) <= 0.2)), 3),
            "below_bound": int(np.sum(logs < 0)), "problems": len(best)}


def forms(best: list[Best]) -> dict:
    """`fit` of both forms on the training role (and on its problems with work under 8 us, where
    the forms differ), at `FLOORS_US` and at the largest floor each allows without a violation."""
    train = [b for b in best if b.split in ROLES["train"]]
    small = [b for b in train if b.work_us < 8.0]
    tightest = {"max": min(b.triton_us for b in train), "sum": min(b.triton_us - b.work_us for b in train)}
    out: dict = {"splits": list(ROLES["train"]), "gpus": sorted({b.gpu for b in train})}
    for form in ("max", "sum"):
        out[form] = {f"t0={t0:g}us": {"all": fit(train, t0, form), "work_under_8us": fit(small, t0, form)}
                     for t0 in FLOORS_US}
        t0 = math.floor(tightest[form] * 100) / 100
        out[form]["tightest"] = {"t0_us": t0, "all": fit(train, t0, form), "work_under_8us": fit(small, t0, form)}
    return out


def rows_below_bound(rows: list[dict]) -> dict:
    """Real rows faster than the bound: no floor, the spec's floor as a max, and as a sum."""
    specs: dict[str, hardware_specs.GpuSpec] = {}
    work: dict[tuple[str, str], float] = {}
    out = {kind: {"rows": 0, "no_floor": 0, "max": 0, "sum": 0} for kind in ("triton", "cublas")}
    for r in rows:
        gpu = specs.setdefault(r["gpu"], hardware_specs.load(r["gpu"]))
        w = work.setdefault((r["gpu"], r["problem"].key), roofline_us(r["problem"], gpu, floor=False))
        c = out[CUBLAS if r["config"] == CUBLAS else "triton"]
        c["rows"] += 1
        c["no_floor"] += r["us"] < w
        c["max"] += r["us"] < max(w, gpu.launch_floor_us)
        c["sum"] += r["us"] < w + gpu.launch_floor_us
    return out


def plot(best: list[Best], floor: float, path: Path) -> None:
    """Best-known time against roofline work time, log-log, with the bounds of both forms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5.5))
    groups = {"train (family)": lambda b: b.split in ROLES["train"],
              "val / test (family)": lambda b: b.split in ("val", "test"),
              "random-test": lambda b: b.split == "random-test"}
    for (label, holds), colour in zip(groups.items(), ("tab:blue", "tab:orange", "tab:red")):
        part = [b for b in best if holds(b)]
        ax.scatter([b.work_us for b in part], [b.triton_us for b in part], s=9, alpha=0.6, c=colour,
                   label=f"{label}: best Triton ({len(part)})")
    part = [b for b in best if math.isfinite(b.cublas_us)]
    ax.scatter([b.work_us for b in part], [b.cublas_us for b in part], s=6, marker="x", c="grey", alpha=0.5,
               label=f"cuBLAS ({len(part)})")
    x = np.logspace(math.log10(min(b.work_us for b in best)) - 0.2, math.log10(max(b.work_us for b in best)), 200)
    ax.plot(x, x, "k:", lw=1, label="roofline work (no floor)")
    ax.plot(x, bound_us(x, floor, "max"), "g--", lw=1, label=f"max(work, {floor:g} us)")
    ax.plot(x, bound_us(x, floor, "sum"), "k-", lw=1.2, label=f"work + {floor:g} us (chosen)")
    ax.set(xscale="log", yscale="log", xlabel="roofline work time (us): FLOPs at peak or bytes at bandwidth",
           ylabel="measured per-call time (us), CUDA-graph replay",
           title="Launch floor: best-known time vs roofline (H200 and its SM slices)")
    ax.set_ylim(bottom=0.5)  # the no-floor line runs on to 0.003 us, far under every kernel
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(rows: list[dict], best: list[Best]) -> dict:
    """Every figure of the module docstring, of `real_rows` and their `bests`."""
    gpus = sorted({b.gpu for b in best})
    return {"fastest": {g: fastest(rows, best, g) for g in gpus},
            "by_work": {g: by_work([b for b in best if b.gpu == g]) for g in gpus},
            "forms": forms(best), "rows_below_bound": rows_below_bound(rows),
            "spec_floor_us": {g: hardware_specs.load(g).launch_floor_us for g in gpus}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="database (the shipped snapshot is loaded into it)")
    ap.add_argument("--png", default="", help="also plot best-known time against roofline work here")
    ap.add_argument("--out", default="", help="also write the JSON here")
    ns = ap.parse_args(argv)
    with Database(ns.db) as db:
        load_shipped(db)
        rows = real_rows(db)
    best = bests(rows)
    out = report(rows, best)
    if ns.png:
        plot(best, hardware_specs.load("h200").launch_floor_us, Path(ns.png))
    text = json.dumps(out, indent=1)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
