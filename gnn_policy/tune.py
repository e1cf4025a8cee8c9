"""`gnn-policy tune`: the policy's ranked configs for one GEMM, optionally measured for real."""
from __future__ import annotations

import dataclasses
import time

from graphs.problem import DTYPES, EPILOGUE_ACTIVATIONS, LAYOUTS
from gnn_policy.args import at_least, flag, one_of
from gnn_policy.limits import check_fits

# under the table where a pick's TFLOP/s is a fine-tune's measurement (`Pick.measured`), marked *
MEASURED_NOTE = "* measured on this GPU by the fine-tune that wrote the checkpoint: its TFLOP/s are that measurement"


@dataclasses.dataclass(frozen=True)
class TuneArgs:
    """Rank tile configs for one GEMM, or pick for every GEMM of a --model, with the policy (and, on a GPU, --measure them)."""

    m: int = flag(0, "rows of A and C (--m, --n and --k give one GEMM; or use --model)", check=at_least(1))
    n: int = flag(0, "columns of B and C", check=at_least(1))
    k: int = flag(0, "the reduction length", check=at_least(1))
    batch: int = flag(1, "batch count", check=at_least(1))
    dtype: str = flag("bf16", "fp16, bf16 or fp32", check=one_of(*DTYPES))
    bias: bool = flag(False, "a bias over N is fused")
    activation: str = flag("", "fused activation: relu, gelu or silu (or none)",
                           check=one_of("", "none", *filter(None, EPILOGUE_ACTIVATIONS)))
    residual: bool = flag(False, "a residual add is fused")
    a_layout: str = flag("row", "A's layout: row (K contiguous) or col (M contiguous)", check=one_of(*LAYOUTS))
    # empty: row, or col under --linear (an explicit row there is a contradiction, not a default)
    b_layout: str = flag("", "B's layout: row (N contiguous; the default) or col (K contiguous: an nn.Linear weight "
                             "W as W.T)", check=one_of("", *LAYOUTS))
    linear: bool = flag(False, "x @ W.T with an nn.Linear weight W [N, K]: A row-major, B column-major")
    gpu: str = flag("", "GPU spec name (default: the local device, or the H200 without one)")
    top_k: int = flag(8, "configs to print", check=at_least(1))
    checkpoint: str = flag("", "policy checkpoint (default: checkpoints/pretrained.pt)")
    json: bool = flag(False, "print JSON")
    measure: bool = flag(False, "time the picks and cuBLAS on the local GPU (needs CUDA)")
    model: str = flag("", "tune a model instead: a config.json (or a shipped example: llama-3-8b, gpt2, "
                          "mixtral-8x7b) or module:function returning (nn.Module, example inputs)")
    tokens: str = flag("", "token counts for --model, comma-separated; empty: 1,16,128,2048")
    tp: int = flag(1, "tensor-parallel degree of a --model config: one GPU's share of its GEMMs, split as vLLM "
                      "splits them (column-parallel N / tp, row-parallel K / tp)", check=at_least(1))


class TuneError(ValueError):
    """Flags that do not name one GEMM or one model."""


def run(args: TuneArgs) -> dict:
    if args.model:
        from gnn_policy.model_tune import run as run_model

        if args.m or args.n or args.k:
            raise TuneError("--model tunes the model's own GEMMs: leave --m, --n and --k out")
        one_gemm = [f"--{name.replace('_', '-')}" for name, on in (
            ("batch", args.batch != 1), ("bias", args.bias), ("activation", args.activation not in ("", "none")),
            ("residual", args.residual), ("a_layout", args.a_layout != "row"), ("b_layout", bool(args.b_layout)),
            ("linear", args.linear)) if on]
        if one_gemm:  # the model's layers decide these; silently ignoring them would mislead
            raise TuneError(f"--model takes each GEMM's shape, layouts and epilogue from the model: leave "
                            f"{', '.join(one_gemm)} out")
        return run_model(args)
    if args.tp != 1:
        raise TuneError("--tp splits the GEMMs of a --model config: give --model, or the shapes of one GPU's share")
    if not (args.m and args.n and args.k):
        raise TuneError("give --m, --n and --k (one GEMM) or --model (a config.json or module:function)")
    import torch

    import hardware_specs
    from graphs import GemmProblem
    from gnn_policy import calibration
    from gnn_policy.calibration_level import displayed
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy

    problem = GemmProblem(args.m, args.n, args.k, batch=args.batch, dtype=args.dtype, bias=args.bias,
                          activation=args.activation if args.activation not in ("", "none") else None,
                          residual=args.residual, **layouts(args))
    if args.gpu:
        gpu = hardware_specs.load(args.gpu)
    else:
        gpu = hardware_specs.detect() if torch.cuda.is_available() else hardware_specs.load("h200")
    check_fits(problem, gpu)
    if args.measure and not torch.cuda.is_available():
        raise hardware_specs.SpecError("--measure needs a CUDA GPU; without one, tune only predicts")
    policy = Policy.load(args.checkpoint or DEFAULT_CHECKPOINT)
    policy.top_k(problem, gpu, args.top_k)  # the first call builds the GPU's validity mask
    start = time.perf_counter()
    picks = policy.top_k(problem, gpu, args.top_k)
    elapsed_ms = round(1e3 * (time.perf_counter() - start), 2)
    # a displayed figure is a calibrated one, never above the roofline
    fits = calibration.load(args.checkpoint or DEFAULT_CHECKPOINT)
    # ... and a fine-tune's measurement of a pick is shown as measured
    shown = [(p.predicted_tflops, False) if p.measured else fig
             for p, fig in zip(picks, displayed([p.predicted_tflops for p in picks], problem, gpu, fits, policy))]
    out = {"problem": problem.key, "gpu": gpu.name, "prediction_ms": elapsed_ms,
           "roofline_tflops": significant(calibration.bound_tflops(problem, gpu)),
           "calibrated": any(fitted for p, (_, fitted) in zip(picks, shown) if not p.measured),
           "picks": [{"config": p.config.key, "fields": dataclasses.asdict(p.config),
                      "probability": round(p.probability, 5), "predicted_tflops": significant(tf),
                      "predicted_us": significant(problem.flops / (tf * 1e6)), "finetune_measured": p.measured}
                     for p, (tf, _) in zip(picks, shown)]}
    if args.measure:
        out.update(_measure(problem, gpu, [p.config for p in picks], out["picks"]))
    return out


def significant(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits: a tiny GEMM's 0.0021 TFLOP/s is not shown as 0.0."""
    return float(f"{value:.{digits}g}")


def layouts(args: TuneArgs) -> dict[str, str]:
    """The operand layouts the flags name; --linear is A row-major and B column-major."""
    if not args.linear:
        return {"a_layout": args.a_layout, "b_layout": args.b_layout or "row"}
    if args.a_layout != "row" or args.b_layout not in ("", "col"):
        given = " ".join(f"--{name}-layout {v}" for name, v, fits in (
            ("a", args.a_layout, "row"), ("b", args.b_layout, "col")) if v and v != fits)
        raise ValueError(f"--linear means A row-major and B column-major; it contradicts {given}")
    return {"a_layout": "row", "b_layout": "col"}


def _measure(problem, gpu, configs, rows: list[dict]) -> dict:
    from gnn_policy.measure.runner import measure_configs

    results = list(measure_configs(problem, [*configs, None], gpu=gpu.name))
    for row, m in zip(rows, results):
        row["measured_tflops"] = round(m.tflops, 1) if m.status == "ok" else m.status
    ok = [m.tflops for m in results[:-1] if m.status == "ok"]
    cublas = results[-1].tflops if results[-1].status == "ok" else None
    return {"cublas_tflops": cublas and round(cublas, 1), "best_measured_tflops": ok and round(max(ok), 1),
            "best_vs_cublas": round(max(ok) / cublas, 3) if ok and cublas else None}


def table(out: dict) -> str:
    how = ("calibrated on measurements" if out["calibrated"] else
           "not calibrated (no fit for this GPU and dtype): the cost head's, capped")
    lines = [f"{out['problem']} on {out['gpu']} (ranked in {out['prediction_ms']} ms); predicted TFLOP/s "
             f"{how} (roofline {out['roofline_tflops']})",
             f"{'#':>2}  {'config':<40} {'prob':>8} {'pred TF/s':>10} {'pred us':>9}"
             + ("  measured" if "cublas_tflops" in out else "")]
    for i, p in enumerate(out["picks"], 1):
        lines.append(f"{i:>2}  {p['config'] + ('*' if p['finetune_measured'] else ''):<40} {p['probability']:>8.4f} "
                     f"{p['predicted_tflops']:>10g} {p['predicted_us']:>9g}"
                     + (f"  {p['measured_tflops']}" if "measured_tflops" in p else ""))
    if any(p["finetune_measured"] for p in out["picks"]):
        lines.append(MEASURED_NOTE)
    if "cublas_tflops" in out:
        lines.append(f"best measured {out['best_measured_tflops']} TFLOP/s, cuBLAS {out['cublas_tflops']}: "
                     f"{out['best_vs_cublas']}x")
    return "\n".join(lines)
