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


def _load(path: Path) -> dict[tuple[str, str], dict]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[(row["problem"], row["config"])] = row
    return rows


def measure_shape(problem, lists, gpu, done, out, replays: int) -> None:
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
                               tflops=t.tflops(problem.flops),
                               rel_err=checked.error if checked else None)
            except Exception as exc:  # out of resources, layout: a row, and the run goes on
                row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        done[(problem.key, key)] = row
        out.write(json.dumps(row) + "\n")
        out.flush()


def retime(problem, lists, gpu, done, rounds: int, replays: int) -> dict[str, float]:
    """Median TFLOP/s over `rounds` interleaved re-timings of cuBLAS and each list's top 3."""
    from gnn_policy.measure.runner import Bench
    from gnn_policy.space import TileConfig

    ok = {k: r for (p, k), r in done.items() if p == problem.key and r["status"] == "ok"}
    contenders = {"cublas"}
    for configs in lists.values():
        keys = sorted((c.key for c in configs if c.key in ok), key=lambda k: -ok[k]["tflops"])
        contenders.update(keys[:3])
    bench = Bench(problem, gpu.l2_bytes, seed=1000)
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for key in sorted(contenders):
            t = bench.time_cublas(replays) if key == "cublas" else bench.time(TileConfig.from_key(key), replays)
            samples[key].append(t.tflops(problem.flops))
    return {k: statistics.median(v) for k, v in samples.items()}


def table(shapes_rows: list[dict]) -> str:
    head = ("| M | N | K | cuBLAS TFLOP/s | triton_tutorial | inductor_mm | random-300 | "
            "best of all | its config |\n|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in shapes_rows:
        best = max((r[name] for name in LISTS), key=lambda x: x["tflops"])
        cells = [f"{x['tflops']:.0f} ({x['tflops'] / r['cublas']:.2f}x)"
                 for x in (r["triton_tutorial"], r["inductor_mm"], r["random"], best)]
        lines.append(f"| {r['m']} | {r['n']} | {r['k']} | {r['cublas']:.0f} | " + " | ".join(cells)
                     + f" | `{best['config']}` |")
    return head + "\n".join(lines)


def run(args: Args) -> str:
    import torch

    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy.measure.compile import precompile

    gpu = hardware_specs.detect()
    lists = candidate_lists(gpu, args.dtype, args.sample, args.seed)
    problems = [GemmProblem(m, n, k, dtype=args.dtype) for m, n, k in args.shapes]
    done = _load(args.results)
    configs = {c.key: c for cs in lists.values() for c in cs}
    jobs = [(p, [c for key, c in configs.items() if (p.key, key) not in done]) for p in problems]
    start = time.time()
    precompile([(p, cs) for p, cs in jobs if cs])
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    summary = []
    with args.results.open("a") as out:
        for p in problems:
            t0 = time.time()
            measure_shape(p, lists, gpu, done, out, args.replays)
            final = retime(p, lists, gpu, done, args.retime, 2 * args.replays)
            row = {"m": p.m, "n": p.n, "k": p.k, "cublas": final["cublas"]}
            for name, cs in lists.items():
                best = max((c.key for c in cs if c.key in final), key=lambda k: final[k])
                row[name] = {"config": best, "tflops": final[best]}
            summary.append(row)
            print(f"{p.key}: {time.time() - t0:.0f} s, " + json.dumps(row), flush=True)
    header = (f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {__import__('triton').__version__}, dtype {args.dtype}, "
              f"{args.sample} random configs (seed {args.seed}), {args.retime} interleaved re-timings")
    md = header + "\n\n" + table(summary)
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
    ap.add_argument("--shapes", type=str, help="M,N,K;M,N,K;... (default: the issue's ten)")
    ns = ap.parse_args(argv)
    shapes = tuple(tuple(int(x) for x in s.split(",")) for s in ns.shapes.split(";")) if ns.shapes else tuple(SHAPES)
    print(run(Args(results=ns.results, sample=ns.sample, seed=ns.seed, retime=ns.retime,
                   replays=ns.replays, shapes=shapes, markdown=ns.markdown)))


if __name__ == "__main__":
    sys.exit(main())
