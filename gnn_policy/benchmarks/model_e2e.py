"""End-to-end forward latency of transformer blocks: torch eager, `torch.compile` (default and
max-autotune) and `gnn_policy.patch`. Needs a CUDA GPU.

    python -m gnn_policy.benchmarks.model_e2e --out docs/data/model_e2e

Blocks (`benchmarks/blocks.py`): a Llama-style decoder layer from the shipped Llama-3-8B config
and a GPT-2-style block from the shipped GPT-2 config, random weights, bf16, run on 1, 16,
128 and 2048 tokens (a prefill without KV cache). A block whose weights fit in twice the L2 is
stacked (GPT-2: several copies in sequence) so that weights stream from memory as in a real
model; latency is per block. Each mode:
- `eager`: the block as it is (cuBLAS under nn.Linear);
- `compile`: `torch.compile(mode="default")`; `max-autotune`: `mode="max-autotune-no-cudagraphs"`
  (every mode is timed inside one CUDA graph of ours, so max-autotune's own graphs are left out);
- `patch`: `gnn_policy.patch` (the policy's pick per shape, fused epilogues).
`setup_s` is the compile time (torch.compile's first call, cold Inductor and Triton caches) or
patch's first call (picks and Triton compiles; the policy's load is timed apart, once).
`graph_ms` is per block by CUDA-graph replay (the project's one timing method), `call_ms` per
block over plain calls (CPU launch overheads included). `rel_err` is the relative Frobenius
error against eager's output; patch must stay within the kernel's bf16 tolerance (1e-2).

Rows are appended to `model_e2e.jsonl` as they finish and a re-run skips those present, so a
run stopped by `--time-limit` (minutes, default 4; no new block and token count starts after
it) goes on where it stopped. The full grid takes several runs; `model_e2e.md` is rewritten
from every row after each.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

BLOCKS = ("llama-3-8b", "gpt2")
TOKENS = (1, 16, 128, 2048)
MODES = ("eager", "compile", "max-autotune", "patch")
COMPILE_MODES = {"compile": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for model_e2e.jsonl and model_e2e.md")
    ap.add_argument("--blocks", default=",".join(BLOCKS), help="shipped configs (or config.json paths), comma-separated")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts, comma-separated")
    ap.add_argument("--modes", default=",".join(MODES), help=f"some of {', '.join(MODES)} (eager always runs: the reference)")
    ap.add_argument("--time-limit", type=float, default=4.0, help="minutes after which no new block and token count starts")
    ap.add_argument("--replays", type=int, default=20, help="CUDA-graph replays timed, at most")
    ns = ap.parse_args(argv)
    ns.blocks, ns.tokens = ns.blocks.split(","), [int(t) for t in ns.tokens.split(",")]
    ns.modes = ["eager"] + [m for m in ns.modes.split(",") if m != "eager"]
    unknown = sorted(set(ns.modes) - set(MODES))
    if unknown:
        ap.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    return ns


def _copies(block, l2_bytes: int) -> int:
    """Blocks in sequence whose weights together stream at least twice the L2 from memory."""
    weights = sum(p.numel() * p.element_size() for p in block.parameters())
    return max(1, math.ceil(2 * l2_bytes / weights))


def _prepare(mode: str, model):
    import torch

    import gnn_policy

    if mode == "eager":
        return model
    if mode == "patch":
        return gnn_policy.patch(model)
    torch._dynamo.reset()
    return torch.compile(model, mode=COMPILE_MODES[mode])


def _call_ms(fn, x, copies: int, calls: int = 20) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls / copies


def measure(config: str, tokens: int, modes: list[str], replays: int, gpu) -> list[dict]:
    """One row per mode for one block and token count (eager first: the reference)."""
    import torch

    from gnn_policy.benchmarks.blocks import build
    from gnn_policy.kernels.reference import relative_error
    from gnn_policy.measure.timing import time_graph

    block, (x,) = build(config, tokens, device="cuda")
    copies = _copies(block, gpu.l2_bytes)
    model = torch.nn.Sequential(block, *(build(config, tokens, device="cuda", seed=i)[0] for i in range(1, copies)))
    rows, reference = [], None
    with torch.inference_mode():
        for mode in modes:
            start = time.perf_counter()
            fn = _prepare(mode, model)
            out = fn(x)
            torch.cuda.synchronize()
            setup_s = time.perf_counter() - start
            reference = out if reference is None else reference
            graph = time_graph(lambda i: fn(x), 1, replays=replays)
            rows.append({"block": config, "tokens": tokens, "mode": mode, "copies": copies,
                         "setup_s": round(setup_s, 2), "graph_ms": round(graph.median_ms / copies, 5),
                         "spread": round(graph.spread, 4), "call_ms": round(_call_ms(fn, x, copies), 5),
                         "rel_err": relative_error(out, reference.double())})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _cell(row: dict | None, base: dict | None, setup: bool) -> str:
    if row is None:
        return "-"
    text = f"{row['graph_ms']:.4f}"
    if base is not None and row is not base:
        text += f" ({base['graph_ms'] / row['graph_ms']:.2f}x)"
    return text + (f", {row['setup_s']:.1f} s" if setup else "")


def table(rows: list[dict]) -> str:
    """Markdown: per block and token count, each mode's time per block (speed-up over eager) and setup."""
    import torch

    from gnn_policy.kernels.reference import TOLERANCE

    tolerance = TOLERANCE[torch.bfloat16]
    by = {(r["block"], r["tokens"], r["mode"]): r for r in rows}
    keys = list(dict.fromkeys((r["block"], r["tokens"]) for r in rows))
    lines = ["| block | tokens | eager ms | compile ms, compile s | max-autotune ms, compile s | patch ms, first call s "
             "| patch vs max-autotune | patch rel err | eager / patch ms without graphs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for block, tokens in keys:
        eager = by.get((block, tokens, "eager"))
        cells = [_cell(by.get((block, tokens, m)), eager, m != "eager") for m in MODES]
        patch, tuned = by.get((block, tokens, "patch")), by.get((block, tokens, "max-autotune"))
        vs = f"{tuned['graph_ms'] / patch['graph_ms']:.2f}x" if patch and tuned else "-"
        err = f"{patch['rel_err']:.1e} ({'ok' if patch['rel_err'] <= tolerance else 'over tolerance'})" if patch else "-"
        plain = f"{eager['call_ms']:.4f} / {patch['call_ms']:.4f}" if patch and eager else "-"
        lines.append(f"| {block} | {tokens} | " + " | ".join(cells) + f" | {vs} | {err} | {plain} |")
    return "\n".join(lines)


def _done(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(argv: list[str] | None = None) -> None:
    ns = parse(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("model_e2e needs a CUDA GPU: it times blocks on the device")
    for env in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # cold caches: compile times as a first run has them
        os.environ.setdefault(env, tempfile.mkdtemp(prefix=env.lower() + "-"))
    import hardware_specs
    from gnn_policy import ops

    gpu = hardware_specs.detect()
    ns.out.mkdir(parents=True, exist_ok=True)
    results = ns.out / "model_e2e.jsonl"
    done = {(r["block"], r["tokens"], r["mode"]) for r in _done(results)}
    if "patch" in ns.modes:
        start = time.perf_counter()
        ops._policy()
        print(f"policy loaded in {time.perf_counter() - start:.1f} s", flush=True)
    deadline = time.perf_counter() + 60 * ns.time_limit
    todo = [(c, t) for c in ns.blocks for t in ns.tokens if any((c, t, m) not in done for m in ns.modes)]
    for config, tokens in todo:
        if time.perf_counter() > deadline:
            print(f"time limit reached: run again to go on from {config} at {tokens} tokens", flush=True)
            break
        rows = measure(config, tokens, ns.modes, ns.replays, gpu)
        with results.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows if (config, tokens, r["mode"]) not in done)
    (ns.out / "model_e2e.md").write_text(table(_done(results)) + "\n")
    print(table(_done(results)))


if __name__ == "__main__":
    main()
