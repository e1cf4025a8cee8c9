"""The calibration's per-problem level: how fast a problem runs at all, beside how its configs rank.

The cost head ranks one problem's configs well and places the problem as a whole badly. On the
H100's random-train rows, the cost head's 8 favourites per problem were off by 0.29 median
|log(predicted / measured)|, of which 0.28 was one offset shared by the problem's configs and
0.05 the spread around it (docs/BENCHMARKS.md, "Calibration: a level per problem"). The
offset follows the problem: a row-major B whose N is odd (no 16-byte vectors, no TMA) ran at
a tenth of its bound while the head expected a third; a K of 32-64 ran faster than expected.
The training objective weighs that offset lightly (it changes no ranking), so the level is
fitted afterwards, on the training role's rows, as part of the calibration:

    log(measured / R) = intercept[gpu] + slope[gpu] x log(predicted / R) + w . level_features

where R is the roofline of the work and w is shared by every GPU of the fit (the H200 has
random shapes only in its test split: a level fitted on its family shapes alone did not
carry over to them). Ridge (`RIDGE`) on standardised features keeps w small where the rows
say little. An offset per problem moves every config of it alike, so picks do not change.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from graphs import GemmProblem
from hardware_specs import GpuSpec
from gnn_policy.calibration import calibrated, roofline_tflops
from gnn_policy.cost_features import leading_dims

# chosen on val (H100 random-val and H200 val) for the default of 2026-12-06 among 0.1-100
# (`calibrate --ridge`); flat from 0.1 to 5, worse from 30 (docs/BENCHMARKS.md)
RIDGE = 3.0
SHAPE_FIELDS = ("log_m", "log_n", "log_k", "log_batch", "a_col", "b_col", "bf16", "bias", "activation", "residual",
                *(f"{lead}_mod{d}" for lead in ("a_lead", "b_lead", "n") for d in (2, 8, 16, 64)),
                *(f"{dim}_mod{d}" for dim in "mnk" for d in (16, 128)),
                "log_roof", "log_bound", "log_intensity")


def shape_features(problem: GemmProblem, gpu: GpuSpec) -> list[float]:
    """The problem's side of the level, in SHAPE_FIELDS order: sizes, layouts, the epilogue,
    which leading dimensions allow wide loads, padding, and where it sits on the roofline."""
    a_lead, b_lead = leading_dims(problem)
    values: list[float] = [math.log(problem.m), math.log(problem.n), math.log(problem.k), math.log(problem.batch),
                           problem.a_layout == "col", problem.b_layout == "col", problem.dtype == "bf16",
                           problem.bias, problem.activation is not None, problem.residual]
    values += [lead % d == 0 for lead in (a_lead, b_lead, problem.n) for d in (2, 8, 16, 64)]
    values += [dim % d == 0 for dim in (problem.m, problem.n, problem.k) for d in (16, 128)]
    values += [math.log(roofline_tflops(problem, gpu, floor=False)), math.log(roofline_tflops(problem, gpu)),
               math.log(problem.flops / problem.bytes_min())]
    return [float(v) for v in values]


def level_features(problem: GemmProblem, gpu: GpuSpec, context: Sequence[float]) -> list[float]:
    """SHAPE_FIELDS, then the policy's context for the problem on the GPU (`Policy.context`):
    what its encoder read of the graph and the spec."""
    return shape_features(problem, gpu) + [float(v) for v in context]


def _standardised(rows: Sequence[dict]) -> tuple[torch.Tensor, ...]:
    """(x, y, z, mean, std) of the rows: log(predicted / R), log(measured / R), and the level
    features standardised by their mean and std (a constant column's std is 1, so ridge gives it
    no weight)."""
    if not rows or len({len(r["features"]) for r in rows}) != 1:
        raise ValueError("a level fit needs rows, all with features of one length")
    feats = torch.tensor([r["features"] for r in rows], dtype=torch.float64)
    x = torch.tensor([math.log(r["predicted"] / r["roof"]) for r in rows], dtype=torch.float64)
    y = torch.tensor([math.log(r["measured"] / r["roof"]) for r in rows], dtype=torch.float64)
    mean, std = feats.mean(0), feats.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return x, y, (feats - mean) / std, mean, std


def fit_level(rows: Sequence[dict], ridge: float = RIDGE) -> tuple[dict[str, tuple[float, float]], tuple[float, ...]]:
    """({gpu: (intercept, slope)}, w) of the model in the module doc, least squares with `ridge`
    on the standardised level features (intercepts and slopes are not shrunk). Each row: gpu,
    predicted, measured, roof (TFLOP/s) and features (`level_features`)."""
    gpus = sorted({r["gpu"] for r in rows})
    x, y, z, mean, std = _standardised(rows)
    onehot = torch.tensor([[r["gpu"] == g for g in gpus] for r in rows], dtype=torch.float64)
    design = torch.cat([onehot, onehot * x[:, None], z], 1)
    penalty = torch.zeros(design.shape[1], dtype=torch.float64)
    penalty[2 * len(gpus):] = ridge
    gram = design.T @ design + torch.diag(penalty)
    if torch.linalg.matrix_rank(gram) < gram.shape[0]:
        raise ValueError("a calibration needs at least two distinct predictions on every GPU")
    coef = torch.linalg.solve(gram, design.T @ y)
    w = coef[2 * len(gpus):] / std
    shift = float((w * mean).sum())  # the standardisation's offset, moved into each intercept
    lines = {g: (float(coef[i]) - shift, float(coef[len(gpus) + i])) for i, g in enumerate(gpus)}
    return lines, tuple(float(v) for v in w)


def fit_ceiling(rows: Sequence[dict], ridge: float = RIDGE, steps: int = 300
                ) -> tuple[dict[str, tuple[float, float, float]], tuple[float, ...], float]:
    """({gpu: (intercept, slope, ceiling)}, w, sharpness): `fit_level`'s model with each GPU's line
    passed through `calibration.softmin` with log(ceiling), least squares by L-BFGS from
    `fit_level`'s solution, the same ridge on the standardised level weights."""
    lines, w0 = fit_level(rows, ridge)
    gpus = sorted(lines)
    x, y, z, mean, std = _standardised(rows)
    at = torch.tensor([gpus.index(r["gpu"]) for r in rows])
    w = (torch.tensor(w0, dtype=torch.float64) * std).requires_grad_()
    shift = float((torch.tensor(w0, dtype=torch.float64) * mean).sum())  # back into the intercepts of z's centring
    a = torch.tensor([lines[g][0] + shift for g in gpus], dtype=torch.float64).requires_grad_()
    b = torch.tensor([lines[g][1] for g in gpus], dtype=torch.float64).requires_grad_()
    # log C = -softplus(-raw) keeps every ceiling below the roofline. The start, C = 0.99 and s = 10,
    # is fit_level's solution to within 1e-6 below 0.3 of the roofline: rows that never come near
    # it keep their line, and a ceiling forms only where rows press against one
    raw = torch.full((len(gpus),), -math.log(math.expm1(-math.log(0.99))), dtype=torch.float64).requires_grad_()
    log_s = torch.tensor(math.log(10.0), dtype=torch.float64).requires_grad_()
    opt = torch.optim.LBFGS([a, b, w, raw, log_s], max_iter=steps, line_search_fn="strong_wolfe")

    def predicted() -> torch.Tensor:
        cap, s = -F.softplus(-raw)[at], log_s.exp()
        return cap - F.softplus(s * (cap - (a[at] + b[at] * x + z @ w))) / s

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = ((predicted() - y) ** 2).sum() + ridge * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    weights = (w / std).detach()
    shift = float((weights * mean).sum())
    ceilings = (-F.softplus(-raw)).exp().tolist()
    fitted = {g: (a[i].item() - shift, b[i].item(), ceilings[i]) for i, g in enumerate(gpus)}
    return fitted, tuple(weights.tolist()), log_s.exp().item()


def displayed(predictions: Sequence[float], problem: GemmProblem, gpu: GpuSpec, calibrations: dict,
              policy) -> list[tuple[float, bool]]:
    """`calibration.calibrated` of each predicted TFLOP/s of one problem, with the level features
    the GPU's fit reads (built once), the context from `policy` (the checkpoint the calibration
    was fitted for)."""
    fitted = calibrations.get(gpu.name)
    features = level_features(problem, gpu, policy.context(problem, gpu)) if fitted and fitted.level else ()
    return [calibrated(p, problem, gpu, calibrations, features) for p in predictions]
