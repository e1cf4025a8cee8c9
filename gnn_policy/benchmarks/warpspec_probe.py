"""Does Triton 3.6 warp-specialise a GEMM on Hopper when its tensor maps are made on the device?

The template's `warpspec` variant hung in four GPU calls on two Hopper cards and is refused on
sm_90 (docs/BENCHMARKS.md, "Warp specialisation on Hopper: refused"). It passes host-side
tensor maps (`TensorDescriptor`) as kernel arguments. Triton's own Hopper tests of warp
specialisation build theirs in the kernel (`tl.make_tensor_descriptor`), and triton-lang/triton
#11587 reports that the pass which splits a tile between two consumer warp groups mis-sizes the
copies of a host-side map (BLOCK_M 128, H100). So this probe runs the two forms of those tests
with device-side maps, outside the template, before anything enters the config space:

* `inner`: one program per output tile, the K loop warp-specialised;
* `persistent`: one program per SM looping over tiles, the tile loop warp-specialised (not
  flattened, as Triton requires on Hopper), the K loop inside it;

and beside each, the same kernel without warp specialisation, the template's best config known
for the shape and cuBLAS, all timed the one way (`gnn_policy.measure.timing.time_graph`, inputs
rotated past twice the L2). Only the main loop is probed: bf16, A row-major, B either layout,
no epilogue. Every config runs in its own process under a timeout, so a hang is a row, not the
end of the call; every result is checked against torch before it is timed.

    python -m gnn_policy.benchmarks.warpspec_probe --out probe.jsonl --markdown probe.md
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import triton
import triton.language as tl

from gnn_policy.kernels.matmul import _tile_coords

# (M, N, K, B layout, the template's best config measured for it on the H100, 2026-12-06)
SHAPES = (
    (1000, 1000, 1000, "row", "bm128_bn128_bk64_sk1_gm8_w4_s4_tma"),
    (256, 4544, 4544, "col", "bm128_bn128_bk64_sk1_gm16_w4_s6_tma"),
    (1537, 4096, 4096, "col", "bm128_bn256_bk64_sk1_gm8_w8_s3_subtile"),
    (3072, 768, 768, "row", "bm64_bn128_bk64_sk1_gm4_w4_s3_tma"),
    (4096, 4096, 4096, "row", "bm128_bn256_bk64_sk1_gm4_w8_s3_subtile"),
)


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    form: str  # "inner" or "persistent"
    block_m: int
    block_n: int
    block_k: int
    stages: int
    warp_specialize: bool = True
    group_m: int = 8
    num_warps: int = 4

    @property
    def key(self) -> str:
        ws = "ws" if self.warp_specialize else "plain"
        return (f"{self.form}_{ws}_bm{self.block_m}_bn{self.block_n}_bk{self.block_k}_s{self.stages}"
                f"_gm{self.group_m}_w{self.num_warps}")

    def smem_bytes(self) -> int:
        """bf16 pipeline buffers plus the staged output tile."""
        return 2 * (self.stages * self.block_k * (self.block_m + self.block_n) + self.block_m * self.block_n)


# BLOCK_M 128 throughout: Triton splits such a tile's rows between two consumer warp groups (64
# rows each, the smallest wgmma), as cuBLAS's kernels do; each warp-specialised config beside
# its plain twin, so what the specialisation itself buys is read off one pair
CONFIGS = tuple(
    ProbeConfig(form, 128, bn, bk, s, ws)
    for form, tiles in (("inner", ((128, 64, 4), (256, 64, 3), (64, 64, 4), (128, 128, 3))),
                        ("persistent", ((128, 64, 4), (256, 64, 3))))
    for bn, bk, s in tiles
    for ws in (True, False)
)


@triton.jit
def _k_step(a_desc, b_desc, acc, pid_m, pid_n, kt, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, B_K_MAJOR: tl.constexpr):
    if B_K_MAJOR:
        b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K]).T
    else:
        b = b_desc.load([kt * BLOCK_K, pid_n * BLOCK_N])
    return tl.dot(a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K]), b, acc)


@triton.jit
def probe_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_b, stride_cm, num_programs,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 B_K_MAJOR: tl.constexpr, PERSISTENT: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    # zero-filled boxes past M, N and K: no masks, the K tail multiplies zeros
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_K_MAJOR:  # B column-major: a map over B^T, [N, K]
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), tiles, num_programs, flatten=False, warp_specialize=WS,
                             num_stages=STAGES):
            pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(k_tiles):
                acc = _k_step(a_desc, b_desc, acc, pid_m, pid_n, kt, BLOCK_M, BLOCK_N, BLOCK_K, B_K_MAJOR)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
    else:
        pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in tl.range(k_tiles, warp_specialize=WS, num_stages=STAGES):
            acc = _k_step(a_desc, b_desc, acc, pid_m, pid_n, kt, BLOCK_M, BLOCK_N, BLOCK_K, B_K_MAJOR)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


def launch(config: ProbeConfig, a, b, c, programs: int):
    """C = A @ B for 2-D A row-major, B row- or column-major, C row-major."""
    m, k = a.shape
    n = b.shape[1]
    b_k_major = b.stride(0) == 1
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    grid = (min(programs, tiles),) if config.form == "persistent" else (tiles,)
    return probe_kernel[grid](a, b, c, m, n, k, a.stride(0), b.stride(1) if b_k_major else b.stride(0), c.stride(0),
                              grid[0], config.block_m, config.block_n, config.block_k, config.group_m, b_k_major,
                              config.form == "persistent", config.stages, config.warp_specialize,
                              num_warps=config.num_warps)


def _operands(m: int, n: int, k: int, layout: str, sets: int) -> list[tuple]:
    """`sets` input sets (A, B as the layout says, and an output C), as the measuring worker makes them."""
    import torch

    from graphs import GemmProblem
    from gnn_policy.measure.inputs import make_inputs

    problem = GemmProblem(m, n, k, dtype="bf16", b_layout=layout)
    out = []
    for i in range(sets):
        args = make_inputs(problem, "cuda", seed=i)
        out.append((args["a"], args["b"], torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
    return out


def run_case(name: str, shapes: list[tuple]) -> None:
    """Child process: one implementation ('cublas', a template config key, or a probe key) over
    `shapes`, one JSON line per shape as soon as it is known."""
    import torch

    from gnn_policy import TileConfig, matmul
    from gnn_policy.kernels.launch import ensure_allocator
    from gnn_policy.kernels.reference import TOLERANCE, reference, relative_error
    from gnn_policy.measure.timing import rotation_count, time_graph

    ensure_allocator()  # the probe's maps are made in the kernel
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    probe = next((c for c in CONFIGS if c.key == name), None)
    for m, n, k, layout, _ in shapes:
        row = {"impl": name, "shape": f"{m}x{n}x{k}_{layout}"}
        t0 = time.perf_counter()
        sets = rotation_count(2 * (m * k + k * n + m * n), l2)
        ops = _operands(m, n, k, layout, sets)
        kernels = []
        if name == "cublas":
            def call(i, ops=ops):
                a, b, c = ops[i]
                return torch.matmul(a, b, out=c)
        elif probe is None:
            config = TileConfig.from_key(name)

            def call(i, ops=ops, config=config):
                a, b, _ = ops[i]
                return matmul(a, b, config=config)
        else:
            if probe.smem_bytes() > torch.cuda.get_device_properties(0).shared_memory_per_block_optin:
                print(json.dumps({**row, "status": "too much shared memory"}), flush=True)
                continue

            def call(i, ops=ops, probe=probe):
                a, b, c = ops[i]
                kernels.append(launch(probe, a, b, c, sms))
                return c
        try:
            a, b, c = ops[0]
            c.fill_(float("nan"))
            out = call(0)
            torch.cuda.synchronize()
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            row["rel_error"] = relative_error(out, reference(a, b))
            if kernels:
                ttgir = kernels[0].asm.get("ttgir", "")
                row["warp_specialized"] = "ttg.warp_specialize" in ttgir
                row["registers"] = getattr(kernels[0], "n_regs", None)
                row["shared_bytes"] = kernels[0].metadata.shared
            if not row["rel_error"] <= TOLERANCE[torch.bfloat16]:
                print(json.dumps({**row, "status": "wrong_result"}), flush=True)
                continue
            timing = time_graph(call, sets, warmup=0)
            row.update(status="ok", median_us=round(timing.median_ms * 1e3, 2),
                       tflops=round(timing.tflops(2 * m * n * k), 1), spread=round(timing.spread, 4))
        except Exception as exc:  # noqa: BLE001 - a compile error is a row of the probe
            row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:400])
        print(json.dumps(row), flush=True)


def _run_child(name: str, shapes: list[tuple], timeout_s: float) -> list[dict]:
    """The rows one child produced; a child that stops answering is killed and its shape in
    flight recorded as `hung`."""
    cmd = [sys.executable, "-m", "gnn_policy.benchmarks.warpspec_probe", "--child", name,
           "--shapes", json.dumps(shapes)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        out, err, rc = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, rc = f"killed after {timeout_s} s", None
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    seen = {r["shape"] for r in rows}
    for m, n, k, layout, _ in shapes:
        shape = f"{m}x{n}x{k}_{layout}"
        if shape not in seen:
            status = "hung" if rc is None else "crashed"
            rows.append({"impl": name, "shape": shape, "status": status, "error": err.strip()[-400:]})
            break  # the shapes after it never ran
    return rows


def report(rows: list[dict]) -> str:
    """A table per shape: TFLOP/s of every implementation, and over cuBLAS."""
    by_shape: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {})[r["impl"]] = r
    lines = ["| shape | implementation | status | WS applied | regs | TFLOP/s | x cuBLAS | x template best |",
             "|---|---|---|---|---|---|---|---|"]
    for shape, impls in by_shape.items():
        cublas = impls.get("cublas", {}).get("tflops")
        template = max((r.get("tflops") or 0 for name, r in impls.items() if name.startswith("bm")), default=0)
        for name, r in sorted(impls.items(), key=lambda kv: -(kv[1].get("tflops") or 0)):
            t = r.get("tflops")
            ratio = f"{t / cublas:.3f}" if t and cublas else "-"
            vs = f"{t / template:.3f}" if t and template else "-"
            ws = {True: "yes", False: "no"}.get(r.get("warp_specialized"), "-")
            lines.append(f"| {shape} | {name} | {r['status']} | {ws} | {r.get('registers') or '-'} | "
                         f"{t or '-'} | {ratio} | {vs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="warpspec_probe.jsonl", help="JSON lines, one per (implementation, shape)")
    ap.add_argument("--markdown", default="", help="also write the table here")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one implementation may take over all shapes")
    ap.add_argument("--shape-count", type=int, default=len(SHAPES), help="the first this many shapes")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_case(args.child, [tuple(s) for s in json.loads(args.shapes)])
    shapes = [list(s) for s in SHAPES[:args.shape_count]]
    names = ["cublas", *sorted({s[4] for s in shapes}), *(c.key for c in CONFIGS)]
    rows = []
    with open(args.out, "w") as f:
        for i, name in enumerate(names):
            # a template config is timed on its own shape; cuBLAS and the probes on all
            todo = [s for s in shapes if s[4] == name] if name.startswith("bm") else shapes
            t0 = time.perf_counter()
            got = _run_child(name, todo, args.timeout)
            for r in got:
                f.write(json.dumps(r) + "\n")
            f.flush()
            rows += got
            bad = [r["status"] for r in got if r["status"] != "ok"]
            print(f"[{i + 1}/{len(names)}] {name}: {len(got) - len(bad)} ok {bad or ''} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    table = report(rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
