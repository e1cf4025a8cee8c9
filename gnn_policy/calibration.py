"""The cost head's predicted TFLOP/s as a figure a user can read: calibrated, never above physics.

The cost head is trained to rank configs; its TFLOP/s are not to scale (2-4x too high on
the H200, and above the roofline: docs/BENCHMARKS.md). A calibration maps them, per GPU, to

    calibrated = min(B, R x exp(min(0, softmin(intercept + slope x log(predicted / R) + level, log C))))

- R, the roofline of the work: FLOPs at the spec's peak or bytes at its bandwidth, whichever
  takes longer. The cost head's efficiency is relative to it (`cost_features.problem_vector`),
  so the fitted line is too.
- level, the problem's offset from the line, from its shape, layouts, alignments and the
  policy's context for it (`gnn_policy.calibration_level`; 0 in a fit without one).
- C, the GPU's ceiling: the share of R its best kernels reach (about 0.84 on the H100 and 0.89
  on the H200 for bf16), and softmin(L, log C) = log C - softplus(s x (log C - L)) / s, a
  smooth minimum of sharpness s. Without it the line, linear in log sizes, ran on into R for
  large GEMMs: 8192^3 showed 988 TFLOP/s on the H100, whose best kernels reach about 800; the
  calibrated figures of 0.8 R or more were 10-12% high on val, and mid efficiencies low
  (docs/BENCHMARKS.md, "A ceiling in the calibration"). A fit without one (C = 1, s = 0) takes
  the plain min.
- B, the bound: R's time plus the GPU's launch floor (`GpuSpec.launch_floor_us`). Under
  CUDA-graph timing no kernel on the H200 took less than 2.5 us, so a tiny problem's R
  (1x2x56x105: 0.003 us) is 1000x faster than any kernel; B is what physics allows, and no
  calibrated figure exceeds it. The floor is added rather than a max: on the training problems
  the sum fits the best-known times better (`gnn_policy.benchmarks.launch_floor`).

The floor caps the line instead of being its base because the shipped cost head was trained
without it: its efficiencies carry the floor's share of a small problem's time already, and
a line fitted on B counted it twice (val median |log error| 0.181 -> 0.234). The numbers
are a least-squares fit on real measurements of the configs the cost head likes best
(`python -m gnn_policy.benchmarks.calibrate`), stored beside the checkpoint as
`<checkpoint>.calibration.json` with the fit's held-out error. A GPU without a fit gets the
cost head's figure capped at B, and says so.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Sequence

from graphs import GemmProblem
from hardware_specs import GpuSpec


def roofline_us(problem: GemmProblem, gpu: GpuSpec, floor: bool = True, tf32: bool = True) -> float:
    """The least time any kernel can take for `problem` on `gpu`, in microseconds: peak FLOP/s or
    bandwidth, whichever binds, plus the launch floor (without it when `floor` is False: the
    work alone). fp32 runs at the TF32 tensor-core peak, or with `tf32` False at the plain fp32
    one (what the cost model reads is the former; `calibrated` bounds by what torch's setting runs)."""
    peak = gpu.peak(("tf32" if tf32 else "fp32") if problem.dtype == "fp32" else problem.dtype) * 1e12
    work = max(problem.flops / peak, problem.bytes_min() / (gpu.memory_bandwidth_gbps * 1e9)) * 1e6
    return work + gpu.launch_floor_us if floor else work


def roofline_tflops(problem: GemmProblem, gpu: GpuSpec, floor: bool = True, tf32: bool = True) -> float:
    """The fastest any kernel can run `problem` on `gpu`, in TFLOP/s (`roofline_us`)."""
    return problem.flops / roofline_us(problem, gpu, floor, tf32) / 1e6


def tf32_enabled() -> bool:
    """Whether fp32 products run on TF32 tensor cores, as torch's matmul setting says (the
    template follows it: `kernels.launch`); False by default in torch."""
    import torch

    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # torch refuses the legacy flag once fp32_precision was set
        return torch.backends.cuda.matmul.fp32_precision == "tf32"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One GPU's map from the cost head's TFLOP/s to measured ones (see the module docstring)."""

    gpu: str
    intercept: float
    slope: float
    # weights of the per-problem level over `calibration_level.level_features` (empty: no level)
    level: tuple[float, ...] = ()
    ceiling: float = 1.0  # C, the share of the roofline this GPU's best kernels reach
    sharpness: float = 0.0  # s of the smooth minimum with log C (0: the plain minimum)
    dtypes: tuple[str, ...] = ()  # the dtypes of the rows it was fitted on (empty: any)

    def __post_init__(self) -> None:
        # a sharpness below 1 would pull every figure far under the ceiling (log 2 / s at the crossing)
        if not 0 < self.ceiling <= 1 or not (self.sharpness == 0 or self.sharpness >= 1):
            raise ValueError(f"calibration of {self.gpu}: ceiling {self.ceiling} must be in (0, 1] "
                             f"and sharpness {self.sharpness} 0 or at least 1")

    def apply(self, predicted_tflops: float, roof: float, bound: float, features: Sequence[float] = ()) -> float:
        """The calibrated TFLOP/s of a prediction for a problem whose roofline of the work is
        `roof` TFLOP/s and whose bound (the roofline with the launch floor) is `bound`;
        `features`: the problem's level features, which a fit with a level needs."""
        if len(features) != len(self.level):
            raise ValueError(f"the calibration of {self.gpu} reads {len(self.level)} level features, "
                             f"got {len(features)} (calibration_level.level_features)")
        level = sum(w * f for w, f in zip(self.level, features))
        line = self.intercept + self.slope * math.log(predicted_tflops / roof) + level
        line = (softmin(line, math.log(self.ceiling), self.sharpness) if self.sharpness
                else min(line, math.log(self.ceiling)))
        return min(bound, roof * math.exp(min(0.0, line)))


def softmin(line: float, cap: float, sharpness: float) -> float:
    """cap - softplus(sharpness x (cap - line)) / sharpness: below both, by log(2) / sharpness where
    they are equal and by less the more they differ (the form `calibration_level.fit_ceiling` fits)."""
    z = sharpness * (cap - line)
    return cap - (max(z, 0.0) + math.log1p(math.exp(-abs(z)))) / sharpness  # softplus(z), without overflow


def path_for(checkpoint: str | Path) -> Path:
    """Where a checkpoint's calibration lives: `pretrained.pt` -> `pretrained.calibration.json`."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + ".calibration.json")


def load(checkpoint: str | Path) -> dict[str, Calibration]:
    """The calibrations fitted for a checkpoint, by GPU name; empty when there is no file."""
    path = path_for(checkpoint)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    level = tuple(data.get("level", {}).get("weights", ()))
    sharpness = data.get("level", {}).get("sharpness", 0.0)
    # a fit written before dtypes were recorded was fitted on 16-bit rows: no fp32 was ever measured
    return {gpu: Calibration(gpu, c["intercept"], c["slope"], level, c.get("ceiling", 1.0), sharpness,
                             tuple(c.get("dtypes", ("bf16", "fp16"))))
            for gpu, c in data["gpus"].items()}


def bound_tflops(problem: GemmProblem, gpu: GpuSpec) -> float:
    """The bound a displayed figure stays under: the roofline with the launch floor, at the
    precision torch's setting runs fp32 in (`tf32_enabled`)."""
    return roofline_tflops(problem, gpu, tf32=problem.dtype != "fp32" or tf32_enabled())


def calibrated(predicted_tflops: float, problem: GemmProblem, gpu: GpuSpec,
               calibrations: dict[str, Calibration], features: Sequence[float] = ()) -> tuple[float, bool]:
    """(figure, whether a fit for this GPU made it): the calibrated TFLOP/s, or without a fit
    for this GPU and dtype the cost head's capped at the bound (the roofline with the launch
    floor; for fp32, at the TF32 peak only where torch's setting runs TF32). `features`: the
    problem's level features where the fit has a level (`calibration_level.displayed` passes them)."""
    bound = bound_tflops(problem, gpu)
    fitted = calibrations.get(gpu.name)
    if fitted and (not fitted.dtypes or problem.dtype in fitted.dtypes):
        roof = roofline_tflops(problem, gpu, floor=False)
        return fitted.apply(predicted_tflops, roof, bound, features), True
    return min(predicted_tflops, bound), False


def fit(predicted: Sequence[float], measured: Sequence[float], roofs: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of log(measured / R) on log(predicted / R), least squares; R: each
    row's roofline of the work (`roofline_tflops(..., floor=False)`)."""
    xs = [math.log(p / r) for p, r in zip(predicted, roofs)]
    ys = [math.log(m / r) for m, r in zip(measured, roofs)]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if n < 2 or var == 0:
        raise ValueError("a calibration needs at least two distinct predictions")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    return my - slope * mx, slope


def errors(estimates: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """DESIGN's calibration figures: median |log(estimate / measured)| and the share within 20%."""
    logs = sorted(abs(math.log(e / m)) for e, m in zip(estimates, measured))
    mid = len(logs) // 2
    median = logs[mid] if len(logs) % 2 else (logs[mid - 1] + logs[mid]) / 2
    within = sum(1 for e, m in zip(estimates, measured) if abs(e / m - 1) <= 0.2) / len(logs)
    return {"median_abs_log_error": round(median, 3), "within_20pct": round(within, 3), "rows": len(logs)}
