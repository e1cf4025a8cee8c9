"""First numbers: cuBLAS vs the best of each named config list and of a random sample.

    python -m gnn_policy.benchmarks.first_numbers --results docs/data/first_numbers.jsonl

Lists: Triton's tutorial and Inductor's max-autotune configs as published (pointer loads),
a random sample of the full space, and `tma_split`: the two lists' tiles on TMA loads with
every SPLIT_K. "Best of all" is the best config measured for the shape in any list.

For each shape (bf16, row-major, no epilogue) it compiles every config ahead on all CPU
cores, checks each against a float64 reference, times the correct ones by CUDA-graph replay,
then re-times the three best of each list and cuBLAS interleaved (`--retime` rounds), because
top configs drift between runs by more than they differ within one. Rows are appended to the
results file as they are measured, and a re-run skips what is already there (resumable).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (1024, 1024, 1024), (1000, 1000, 1000),
          (16, 4096, 4096), (128, 4096, 4096), (1024, 14336, 4096), (1024, 4096, 14336),
          (64, 64, 32768), (3072, 768, 768)]
LISTS = ("triton_tutorial", "inductor_mm", "random", "tma_split")


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line options (see --help)."""

    results: Path
    sample: int = 300
    seed: int = 0
    dtype: str = "bf16"
    retime: int = 3
    replays: int = 10
    shapes: tuple[tuple[int, int, int], ...] = tuple(SHAPES)
    markdown: Path | None = None


def candidate_lists(gpu, dtype: str, sample: int, seed: int) -> dict[str, list]:
    from gnn_policy.space import named_list, space, violations

    pool = [c for c in space("full") if not violations(c, gpu, dtype)]
    rng = random.Random(seed)
    named = list(named_list("triton_tutorial")) + list(named_list("inductor_mm"))
    # The named lists' tiles on this template's TMA loads, each with every split-K.
    tma_split = sorted({dataclasses.replace(c, variant="tma", split_k=s) for c in named
                        for s in space("full").values["split_k"]})
    return {"triton_tutorial": list(named_list("triton_tutorial")),
            "inductor_mm": list(named_list("inductor_mm")),
            "random": rng.sample(pool, sample),
            "tma_split": [c for c in tma_split if not violations(c, gpu, dtype)]}


def _load(path: Path) -> tuple[dict[tuple[str, str], dict], dict[str, dict[str, list[float]]], dict]:
    """(sweep rows by (problem, config), re-timed TFLOP/s by problem and config, last meta row)."""
    sweep: dict[tuple[str, str], dict] = {}
    retimed: dict[str, dict[str, list[float]]] = {}
    meta: dict = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            phase = row.get("phase", "sweep")
            if phase == "meta":
                meta = row
            elif phase == "retime":
                retimed.setdefault(row["problem"], {}).setdefault(row["config"], []).append(row["tflops"])
                if row.get("sm_mhz"):
                    retimed[row["problem"]].setdefault("sm_mhz", []).append(row["sm_mhz"])
            else:
                sweep[(row["problem"], row["config"])] = row
    return sweep, retimed, meta


def measure_shape(problem, lists, gpu, done, out, replays: int) -> None:
    from gnn_policy.measure.clocks import sm_clock_mhz
    from gnn_policy.measure.runner import Bench
    from gnn_policy.space import violations

    from tqdm import tqdm

    bench = None
    todo = [("cublas", None)] + sorted({(c.key, c) for cs in lists.values() for c in cs},
                                       key=lambda x: x[0])
    for key, config in tqdm(todo, desc=problem.key, unit="cfg", mininterval=10):
        if (problem.key, key) in done:
            continue
        bench = bench or Bench(problem, gpu.l2_bytes)
        row = {"problem": problem.key, "config": key, "m": problem.m, "n": problem.n, "k": problem.k}
        found = violations(config, gpu, problem.dtype, problem.k) if config else []
        if found:
            row.update(status="invalid", error="; ".join(str(v) for v in found))
        else:
            try:
                checked = bench.check(config) if config else None
                if checked and not checked.ok:
                    row.update(status="wrong_result", error=f"rel err {checked.error:.3g}")
                else:
                    t = bench.time(config, replays) if config else bench.time_cublas(replays)
                    row.update(status="ok", median_ms=t.median_ms, spread=t.spread,
                               tflops=t.tflops(problem.flops), sm_mhz=sm_clock_mhz(),
                               rel_err=checked.error if checked else None)
            except Exception as exc:  # out of resources, layout: a row, and the run goes on
                row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        done[(problem.key, key)] = row
        out.write(json.dumps(row) + "\n")
        out.flush()


def contenders(problem, lists, done) -> set[str]:
    """cuBLAS and the three fastest correct configs of each list in the sweep."""
    ok = {k: r for (p, k), r in done.items() if p == problem.key and r["status"] == "ok"}
    keys = {"cublas"}
    for configs in lists.values():
        ranked = sorted((c.key for c in configs if c.key in ok), key=lambda k: -ok[k]["tflops"])
        keys.update(ranked[:3])
    return keys


def retime(problem, lists, gpu, done, rounds: int, replays: int, out) -> None:
    """Re-time cuBLAS and each list's top 3 in `rounds` interleaved rounds; rows go to `out`."""
    from gnn_policy.measure.clocks import sm_clock_mhz
    from gnn_policy.measure.runner import Bench
    from gnn_policy.space import TileConfig

    bench = Bench(problem, gpu.l2_bytes, seed=1000)
    for i in range(rounds):
        for key in sorted(contenders(problem, lists, done)):
            t = bench.time_cublas(replays) if key == "cublas" else bench.time(TileConfig.from_key(key), replays)
            out.write(json.dumps({"phase": "retime", "round": i, "problem": problem.key, "config": key,
                                  "tflops": t.tflops(problem.flops), "spread": t.spread,
                                  "sm_mhz": sm_clock_mhz()}) + "\n")
            out.flush()


def _ratio(x: float, base: float) -> str:
    return f"{x:.0f} ({x / base:.2f}x)"


def main_table(problems, lists, retimed) -> str:
    """cuBLAS and the best of each list, from the interleaved re-timings (median of rounds)."""
    head = ("| M | N | K | cuBLAS TFLOP/s | triton_tutorial | inductor_mm | random-300 | "
            "best of all | its config | SM MHz |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for p in problems:
        clocks = retimed.get(p.key, {}).get("sm_mhz", [])
        mhz = f"{min(clocks)}-{max(clocks)}" if clocks else "?"
        final = {k: statistics.median(v) for k, v in retimed.get(p.key, {}).items() if k != "sm_mhz"}
        if "cublas" not in final:
            continue
        best = {name: max((c.key for c in cs if c.key in final), key=final.get) for name, cs in lists.items()}
        top = max(best.values(), key=final.get)
        cells = [_ratio(final[best[n]], final["cublas"]) for n in ("triton_tutorial", "inductor_mm", "random")]
        lines.append(f"| {p.m} | {p.n} | {p.k} | {final['cublas']:.0f} | " + " | ".join(cells)
                     + f" | {_ratio(final[top], final['cublas'])} | `{top}` | {mhz} |")
    return head + "\n".join(lines)


def variant_table(problems, lists, sweep) -> str:
    """The named lists' tiles with pointer loads vs TMA loads, and TMA with split-K (sweep values)."""
    head = ("| M | N | K | cuBLAS | best pointer loads | best TMA loads, SPLIT_K 1 | best TMA, SPLIT_K > 1 |"
            "\n|---|---|---|---|---|---|---|\n")
    lines = []
    for p in problems:
        def best(configs):
            rows = [sweep.get((p.key, c.key)) for c in configs]
            rows = [r for r in rows if r and r["status"] == "ok"]
            return max(rows, key=lambda r: r["tflops"]) if rows else None

        named = lists["triton_tutorial"] + lists["inductor_mm"]
        cub = sweep.get((p.key, "cublas"))
        cells = [best(named), best([c for c in lists["tma_split"] if c.split_k == 1]),
                 best([c for c in lists["tma_split"] if c.split_k > 1])]
        if not cub or not all(cells):
            continue
        text = [f"{r['tflops']:.0f} ({r['tflops'] / cub['tflops']:.2f}x) `{r['config']}`" for r in cells]
        lines.append(f"| {p.m} | {p.n} | {p.k} | {cub['tflops']:.0f} | " + " | ".join(text) + " |")
    return head + "\n".join(lines)


def report(args: Args, gpu) -> str:
    """Both tables from the results file alone (no GPU needed)."""
    from graphs import GemmProblem

    sweep, retimed, meta = _load(args.results)
    lists = candidate_lists(gpu, args.dtype, args.sample, args.seed)
    problems = [GemmProblem(m, n, k, dtype=args.dtype) for m, n, k in args.shapes]
    header = (f"GPU: {meta.get('gpu', '?')} (driver {meta.get('driver', '?')}), torch {meta.get('torch', '?')}, "
              f"triton {meta.get('triton', '?')}, measured {meta.get('date', '?')}; dtype {args.dtype}, "
              f"{args.sample} random configs (seed {args.seed}), {args.retime} interleaved re-timings")
    return (header + "\n\n" + main_table(problems, lists, retimed)
            + "\n\nSame tiles, pointer vs TMA loads (single sweep timings, cuBLAS timed first):\n\n"
            + variant_table(problems, lists, sweep))


def _meta() -> dict:
    import datetime
    import subprocess

    import torch
    import triton

    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    return {"phase": "meta", "gpu": torch.cuda.get_device_name(), "driver": driver,
            "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat()}


def run(args: Args) -> str:
    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy.measure.compile import precompile

    gpu = hardware_specs.detect()
    lists = candidate_lists(gpu, args.dtype, args.sample, args.seed)
    problems = [GemmProblem(m, n, k, dtype=args.dtype) for m, n, k in args.shapes]
    done, retimed, _ = _load(args.results)
    configs = {c.key: c for cs in lists.values() for c in cs}
    jobs = [(p, [c for key, c in configs.items() if (p.key, key) not in done]) for p in problems]
    # Kernels of an earlier run are not in this machine's cache: compile what re-timing needs.
    jobs += [(p, [configs[k] for k in contenders(p, lists, done) if k in configs]) for p in problems
             if p.key not in retimed]
    start = time.time()
    precompile([(p, cs) for p, cs in jobs if cs])
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as out:
        out.write(json.dumps(_meta()) + "\n")
        for p in problems:
            t0 = time.time()
            measure_shape(p, lists, gpu, done, out, args.replays)
            if p.key not in retimed:
                retime(p, lists, gpu, done, args.retime, 2 * args.replays, out)
            print(f"{p.key}: {time.time() - t0:.0f} s", flush=True)
    md = report(args, gpu)
    if args.markdown:
        args.markdown.write_text(md + "\n")
    return md


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True, help="JSONL of rows; appended, resumed")
    ap.add_argument("--markdown", type=Path, help="write the table here too")
    ap.add_argument("--sample", type=int, default=300, help="random configs from the full space")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--retime", type=int, default=3, help="interleaved re-timing rounds")
    ap.add_argument("--replays", type=int, default=10, help="graph replays per timing (x2 when re-timing)")
    ap.add_argument("--report", action="store_true", help="only print the tables from --results (no GPU)")
    ap.add_argument("--gpu", default="h200", help="spec for --report (the GPU the results came from)")
    ap.add_argument("--shapes", type=str, help="M,N,K;M,N,K;... (default: the issue's ten)")
    ns = ap.parse_args(argv)
    shapes = tuple(tuple(int(x) for x in s.split(",")) for s in ns.shapes.split(";")) if ns.shapes else tuple(SHAPES)
    args = Args(results=ns.results, sample=ns.sample, seed=ns.seed, retime=ns.retime,
                replays=ns.replays, shapes=shapes, markdown=ns.markdown)
    if ns.report:
        import hardware_specs

        print(report(args, hardware_specs.load(ns.gpu)))
    else:
        print(run(args))


if __name__ == "__main__":
    sys.exit(main())
