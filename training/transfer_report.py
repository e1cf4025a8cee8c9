"""The report of `gnn-policy transfer`: transfer.csv and transfer.md (the summary table by
method and budget, how many measurements scratch needs to match meta, the guard's verdicts,
top-1 by problem size), transfer.png, and one W&B run per (method, budget, seed).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from training.transfer_args import TransferArgs
from training.transfer_args import POLICIES, SEARCHES, SPEC_ONLY
from training.transfer_picks import LISTS


def summary(rows: list[dict]) -> dict[tuple[str, int | None], dict[str, float]]:
    """(method, budget) -> geomean top-1 and top-8 over problems, averaged over seeds."""
    from gnn_policy.benchmarks.data_report import geomean

    out = {}
    for key in dict.fromkeys((r["method"], r["budget"]) for r in rows):
        sel = [r for r in rows if (r["method"], r["budget"]) == key]
        seeds = sorted({r["seed"] for r in sel})
        out[key] = {m: sum(geomean([r[m] for r in sel if r["seed"] == s]) for s in seeds) / len(seeds)
                    for m in ("top1", "top8")}
    return out


def _methods(table: dict) -> list[str]:
    """The methods present, policies first, then searches, then spec-only baselines."""
    present = {m for m, _ in table}
    return [m for m in (*POLICIES, *SEARCHES, *SPEC_ONLY) if m in present]


def measurements_to_reach(table: dict, method: str, goal: float, metric: str = "top1") -> int | None:
    """The smallest budget at which `method` reaches `goal` (None: never within the budgets run)."""
    reached = sorted(b for (m, b), v in table.items() if m == method and b is not None and v[metric] >= goal)
    return reached[0] if reached else None


def write_report(rows: list[dict], budgets: list[int], out: Path, target: str, source: str,
                 name: str = "transfer", note: str = "") -> str:
    """<name>.csv, <name>.md and <name>.png in `out`; `note` heads the markdown."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{name}.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    table = summary(rows)
    methods = _methods(table)
    cell = lambda m, b, k: f"{table[m, b][k]:.3f}" if (m, b) in table else "-"  # noqa: E731
    lines = [note, ""] if note else []
    lines += [f"Transfer to {target} ({source} labels), geomean fraction of best known over "
             f"{len({r['problem'] for r in rows})} {rows[0].get('split', 'test')} problems, top-1 / top-8, by budget B:", "",
             "| method | " + " | ".join(f"B={b}" for b in budgets) + " | spec only |",
             "|---|" + "---|" * (len(budgets) + 1)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{cell(m, b, 'top1')} / {cell(m, b, 'top8')}" for b in budgets)
                     + f" | {cell(m, None, 'top1')} / {cell(m, None, 'top8')} |")
    if ("meta", 64) in table and any(m == "scratch" for m, _ in table):
        goal = table["meta", 64]["top1"]
        need = measurements_to_reach(table, "scratch", goal)
        ran = max(b for m, b in table if m == "scratch" and b is not None)  # a partial report lacks the top ones
        lines += ["", f"meta at B=64 reaches top-1 {goal:.3f}; scratch reaches it at "
                      + (f"B={need} ({need / 64:.1f}x the measurements)" if need is not None else
                         f"no budget up to {ran} (more than {ran / 64:.0f}x)")]
    lines += _guard_lines(rows)
    lines += ["", *_by_size(rows, table)]
    text = "\n".join(lines)
    (out / f"{name}.md").write_text(text + "\n")
    _plot(table, budgets, out / f"{name}.png", target, source)
    return text


def _guard_lines(rows: list[dict]) -> list[str]:
    """Which fine-tunes kept their adapted weights, the calibration alone, or fell back to the start
    (`finetune`'s guard): a fallback's picks are its B = 0 picks. Nothing for rows from before the guard."""
    runs = dict.fromkeys((r["method"], r["budget"], r["seed"], r.get("kept")) for r in rows if r.get("kept"))
    if not runs:
        return []
    seeds = len({seed for _, _, seed, _ in runs}) > 1
    said = {kept: ", ".join(f"{m} B={b}" + (f" seed {seed}" if seeds else "") for m, b, seed, k in runs if k == kept)
            or "none" for kept in ("adapted", "calibrated", "start", "unjudged")}
    calibrated = f" Kept the calibration alone: {said['calibrated']}." if said["calibrated"] != "none" else ""
    return ["", f"Fine-tunes that kept their adapted weights: {said['adapted']}.{calibrated} Fell back to the "
                f"starting weights because the guard's cross-fit found them no better: {said['start']}; because "
                f"too few configs were measured to judge them: {said['unjudged']}."]


def _by_size(rows: list[dict], table: dict) -> list[str]:
    """Top-1 by problem size (`SIZE_GROUPS`) at each method's smallest, B = 64 and largest
    budget, then what each method present spends, since the searches spend their B on every problem."""
    from gnn_policy.benchmarks.data_report import SIZE_GROUPS
    from graphs import GemmProblem

    problems = {k: GemmProblem.from_key(k) for k in dict.fromkeys(r["problem"] for r in rows)}
    groups = {g: {k for k, p in problems.items() if holds(p)} for g, holds in SIZE_GROUPS.items()}
    lines = ["Top-1 by problem size (geomean; problems in brackets):", "",
             "| method | B | " + " | ".join(f"{g} ({len(ks)})" for g, ks in groups.items()) + " |",
             "|---|---|" + "---|" * len(groups)]
    methods = _methods(table)
    for m in methods:
        spent = sorted(b for k, b in table if k == m and b is not None)
        for b in dict.fromkeys([spent[0], *(b for b in spent if b == 64), spent[-1]] if spent else [None]):
            cells = []
            for ks in groups.values():
                sel = [r for r in rows if (r["method"], r["budget"]) == (m, b) and r["problem"] in ks]
                cells.append(f"{summary(sel)[m, b]['top1']:.3f}" if sel else "-")
            lines.append(f"| {m} | {'spec only' if b is None else b} | " + " | ".join(cells) + " |")
    n, present = len(problems), lambda group: ", ".join(m for m in group if m in methods)
    tuned = present(POLICIES) + (" (served on these problems, the others on other problems)"
                                 if "served" in methods and len(present(POLICIES).split(", ")) > 1 else "")
    spend = [f"{tuned} spend B in all; their top-8 costs 8 a problem" if present(POLICIES) else "",
             f"{present(SEARCHES)} spend B on each of the {n} problems ({n} x B in all)" if present(SEARCHES) else "",
             f"{present(LISTS)} time their whole list on each problem" if present(LISTS) else ""]
    return lines + ["", "Measurements on the target: " + "; ".join(c for c in spend if c) + "."]


def _plot(table: dict, budgets: list[int], path: Path, target: str, source: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, metric in zip(axes, ("top1", "top8")):
        for i, method in enumerate(_methods(table)):
            points = [(b, table[method, b][metric]) for b in budgets if (method, b) in table]
            color = f"C{i}"
            if (method, None) in table:
                ax.axhline(table[method, None][metric], ls="--", color=color, lw=1, label=method)
            elif points:
                ax.plot(*zip(*points), marker="o", color=color, label=method, lw=2.2 if method == "meta" else 1.3)
        ax.set_xscale("symlog", base=2, linthresh=16)  # B = 0 belongs on the axis
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
        ax.set(xlabel="measurements on the target (B)", title=f"{metric}, {target} ({source})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of best known (geomean)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_wandb(args: TransferArgs, rows: list[dict], target: str) -> None:
    import wandb

    from gnn_policy.benchmarks.data_report import geomean
    from training.tracking import wandb_run

    for method, budget in dict.fromkeys((r["method"], r["budget"]) for r in rows):
        for seed in sorted({r["seed"] for r in rows}):
            sel = [r for r in rows if (r["method"], r["budget"], r["seed"]) == (method, budget, seed)]
            if not sel:
                continue
            run = wandb_run(Path(args.work) / "wandb", job_type="transfer", group=f"transfer-{target}",
                            tags=[f"method={method}", f"budget={budget}", f"seed={seed}"],
                            config={**dataclasses.asdict(args), "method": method, "budget": budget, "seed": seed},
                            run_id=f"transfer-{target}-{method}-B{budget}-s{seed}".replace("/", "_"))
            run.log({"transfer/budget": -1 if budget is None else budget,
                     "transfer/top1": geomean([r["top1"] for r in sel]),
                     "transfer/top8": geomean([r["top8"] for r in sel]),
                     "transfer/problems": wandb.Table(columns=list(sel[0]), data=[list(r.values()) for r in sel])})
            run.finish()
