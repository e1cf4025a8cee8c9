"""An analytic GEMM time model: roofline, wave quantisation, occupancy, L2 reuse, split-K.

    T = launch + max(T_compute, T_memory) + T_splitk

- Occupancy: blocks per SM, limited by shared memory ((BM + BN) x BK x stages x bytes), by
  threads (32 x warps) and by the accumulator registers.
- Waves: programs (tiles x batch x SPLIT_K) over resident slots, rounded up: a last
  partial wave costs a full one.
- T_compute: the per-SM share of the peak rate, times a tile efficiency that saturates with
  BM x BN (small tiles starve the tensor cores), plus a latency per K iteration that deeper
  pipelines and co-resident blocks hide.
- T_memory: A is re-read once per column of tiles and B once per row of tiles, except the
  share that L2 serves (GROUP_M keeps a band of A rows hot), plus the output, bias and
  residual; at an effective fraction of the memory bandwidth.
- T_splitk: the fp32 partial tiles written and read back once per slice.

The nine coefficients are fitted on real measurements (`fit`) by least squares on log time,
so `predict` works for any GpuSpec: simulated labels for GPUs we cannot run, and the
`analytic` baseline the policy must beat.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from graphs import GemmProblem
from hardware_specs import GpuSpec
from gnn_policy.space import DTYPE_BYTES, TMA_VARIANTS, TileConfig

COEFFICIENTS = ("tile_half", "efficiency", "iter_us", "launch_us", "bandwidth", "l2_miss", "splitk_us",
                "tma_gain", "warp_gain")


@dataclasses.dataclass(frozen=True)
class AnalyticModel:
    """Fitted coefficients (each positive); see the module docstring for their roles."""

    tile_half: float = 4096.0  # BM x BN at which a tile reaches half the peak efficiency
    efficiency: float = 0.8  # the largest fraction of peak a tile reaches
    iter_us: float = 0.3  # latency of one K iteration, before pipelining and co-residency hide it
    launch_us: float = 4.0
    bandwidth: float = 0.8  # achievable fraction of the memory bandwidth
    l2_miss: float = 0.3  # share of operand re-reads that L2 does not serve
    splitk_us: float = 2.0  # fixed cost of the split-K reduction
    tma_gain: float = 1.1  # TMA loads: latency divided by this
    warp_gain: float = 1.0  # tile efficiency gained per doubling of warps, relative

    def vector(self) -> torch.Tensor:
        return torch.tensor([getattr(self, n) for n in COEFFICIENTS], dtype=torch.float64)

    def predict_ms(self, rows: Sequence[tuple[GemmProblem, TileConfig, GpuSpec]]) -> torch.Tensor:
        return _time_ms(_features(rows), self.vector()).detach()

    def predict_tflops(self, problem: GemmProblem, configs: Sequence[TileConfig], gpu: GpuSpec) -> list[float]:
        ms = self.predict_ms([(problem, c, gpu) for c in configs])
        return [problem.flops / (t * 1e-3) / 1e12 for t in ms.tolist()]


def _features(rows: Sequence[tuple[GemmProblem, TileConfig, GpuSpec]]) -> dict[str, torch.Tensor]:
    cols: dict[str, list[float]] = {k: [] for k in (
        "flops_prog", "progs", "slots", "per_sm", "k_iters", "stages", "tma", "tile", "warps", "peak_sm_us",
        "bytes_a", "bytes_b", "bytes_out", "tiles_m", "tiles_n", "group", "l2_fit", "bw_us", "splitk", "ws_bytes")}
    for p, c, g in rows:
        e = DTYPE_BYTES[p.dtype]
        tiles_m, tiles_n = math.ceil(p.m / c.block_m), math.ceil(p.n / c.block_n)
        progs = tiles_m * tiles_n * p.batch * c.split_k
        smem = (c.block_m + c.block_n) * c.block_k * c.num_stages * e
        per_sm = max(1, min(g.smem_per_sm_bytes // max(smem, 1), g.max_threads_per_sm // (32 * c.num_warps),
                            g.registers_per_sm // max(1, c.block_m * c.block_n + 64 * 32 * c.num_warps)))
        k_iters = math.ceil(math.ceil(p.k / c.block_k) / c.split_k)
        peak = g.peak("tf32" if p.dtype == "fp32" else p.dtype)
        operands = e * p.batch * (p.m * p.k + p.k * p.n)
        out = e * p.batch * p.m * p.n * (2 if p.residual else 1) + (e * p.n if p.bias else 0)
        for key, value in (
                ("flops_prog", 2.0 * c.block_m * c.block_n * c.block_k * k_iters), ("progs", progs),
                ("slots", g.sm_count * per_sm), ("per_sm", per_sm), ("k_iters", k_iters),
                ("stages", c.num_stages), ("tma", float(c.variant in TMA_VARIANTS)), ("tile", c.block_m * c.block_n),
                ("warps", c.num_warps), ("peak_sm_us", peak * 1e6 / g.sm_count),
                ("bytes_a", e * p.batch * p.m * p.k), ("bytes_b", e * p.batch * p.k * p.n), ("bytes_out", out),
                ("tiles_m", tiles_m), ("tiles_n", tiles_n), ("group", c.group_m),
                ("l2_fit", min(1.0, g.l2_bytes / max(operands, 1))), ("bw_us", g.memory_bandwidth_gbps * 1e3),
                ("splitk", float(c.split_k > 1)), ("ws_bytes", 8.0 * p.batch * p.m * p.n * c.split_k * (c.split_k > 1))):
            cols[key].append(float(value))
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in cols.items()}


def _time_ms(f: dict[str, torch.Tensor], theta: torch.Tensor) -> torch.Tensor:
    tile_half, eff, iter_us, launch_us, bw, miss, splitk_us, tma_gain, warp_gain = theta.unbind()
    waves = torch.ceil(f["progs"] / f["slots"])
    # blocks sharing an SM at once: fewer than the limit when the grid is smaller than one wave
    resident = torch.minimum(f["per_sm"], torch.ceil(f["progs"] / (f["slots"] / f["per_sm"])))
    sat = f["tile"] / (f["tile"] + tile_half) * (f["warps"] / 4) ** (0.1 * torch.log(warp_gain + 1e-9))
    compute_us = f["flops_prog"] * resident / (f["peak_sm_us"] * eff * sat.clamp(max=1.0))
    hide = torch.minimum(f["stages"], torch.full_like(f["stages"], 4.0)) * resident * (1 + (tma_gain - 1) * f["tma"])
    latency_us = f["k_iters"] * iter_us / hide
    t_compute = waves * (compute_us + latency_us)
    # the share of operand re-reads that reaches DRAM: all when the operands dwarf L2, `miss` when they fit
    reread = miss + (1 - miss) * (1 - f["l2_fit"])
    a_reads = 1 + (f["tiles_n"] - 1) * reread / (1 + f["group"].log2())
    b_reads = 1 + (f["tiles_m"] - 1) * reread / (1 + f["group"].log2())
    bytes_ = f["bytes_a"] * a_reads.clamp(max=64) + f["bytes_b"] * b_reads.clamp(max=64) + f["bytes_out"]
    t_memory = (bytes_ + f["ws_bytes"]) / (f["bw_us"] * bw)
    return (launch_us + torch.maximum(t_compute, t_memory) + f["splitk"] * splitk_us) * 1e-3


def fit(rows: Sequence[tuple[GemmProblem, TileConfig, GpuSpec]], measured_ms: Sequence[float],
        steps: int = 600, start: AnalyticModel = AnalyticModel()) -> AnalyticModel:
    """Least squares on log time over correct measurements; coefficients kept positive."""
    f = _features(rows)
    target = torch.log(torch.tensor(measured_ms, dtype=torch.float64))
    log_theta = start.vector().log().clone().requires_grad_(True)
    opt = torch.optim.Adam([log_theta], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = (torch.log(_time_ms(f, log_theta.exp())) - target).pow(2).mean()
        loss.backward()
        opt.step()
    return AnalyticModel(**dict(zip(COEFFICIENTS, log_theta.detach().exp().tolist())))


class SimulatedPool:
    """A WorkerPool look-alike whose measurements come from the analytic model (source=simulated)."""

    def __init__(self, model: AnalyticModel, gpu: GpuSpec):
        self.model, self.gpu = model, gpu
        self.versions = "analytic " + " ".join(f"{getattr(model, n):.4g}" for n in COEFFICIENTS)

    def run(self, problem: GemmProblem, configs: Sequence[TileConfig]):
        from gnn_policy.measure.result import Measurement

        for config, ms in zip(configs, self.model.predict_ms([(problem, c, self.gpu) for c in configs]).tolist()):
            yield Measurement(self.gpu.name, problem.key, config.key, "ok", source="simulated", median_ms=ms,
                              tflops=problem.flops / (ms * 1e-3) / 1e12, versions=self.versions)


def _fit_file(path) -> dict:
    """The JSON `benchmarks/fit_analytic.py` wrote; CheckpointError naming the file for anything else."""
    import json

    from gnn_policy.checkpoint import CheckpointError

    try:
        with open(path, encoding="utf-8") as f:
            fit = json.load(f)
    except FileNotFoundError:  # the command line says so in one line already
        raise
    except (OSError, ValueError) as exc:  # unreadable, bytes that are not text, not JSON
        raise CheckpointError(f"{path}: not a fitted analytic model ({exc})") from None
    coefficients = fit.get("coefficients") if isinstance(fit, dict) else None
    numbers = isinstance(coefficients, dict) and all(
        isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in coefficients.values())
    if not (numbers and set(coefficients) <= set(COEFFICIENTS) and isinstance(fit.get("gpus"), list)):
        raise CheckpointError(f"{path}: not a fitted analytic model (expected 'gpus' and positive 'coefficients' "
                              f"among {', '.join(COEFFICIENTS)})")
    return fit


def fitted_gpus(path) -> list[str]:
    """The GPUs whose measurements the coefficients at `path` were fitted on."""
    return _fit_file(path)["gpus"]


def load_fitted(path) -> AnalyticModel:
    """The coefficients `benchmarks/fit_analytic.py` wrote."""
    return AnalyticModel(**_fit_file(path)["coefficients"])
