"""`gnn-policy tune --model SPEC`: the policy's first pick for every distinct GEMM of a model.

SPEC is a Hugging Face-style config.json (or a shipped example's name, see
graphs.model_config), or `module:function` (`path/to/file.py:function` too) returning
`(nn.Module, example_inputs)`, whose GEMMs `graphs.capture` traces; a function with a `tokens`
parameter is called once per token count. Layers sharing a computation (shape, layouts,
epilogue) share a row; `calls` counts how often one forward pass runs it, which is what the
model's total GEMM time under `--measure` weighs each row by.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from graphs import GemmProblem
from graphs.model_config import config_path, examples, load_config, model_gemms, sharded, skipped


DEFAULT_TOKENS = (1, 16, 128, 2048)


class ModelSpecError(ValueError):
    """A `module:function` spec that cannot be loaded or returns something else."""


def parse_tokens(text: str) -> list[int]:
    """'1,16,128' -> [1, 16, 128]; anything but positive integers is an error that says so."""
    try:
        tokens = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ModelSpecError(f"--tokens must be comma-separated positive integers, got {text!r}") from None
    if not tokens or min(tokens) < 1:
        raise ModelSpecError(f"--tokens must be comma-separated positive integers, got {text!r}")
    return tokens


def is_config(spec: str) -> bool:
    """Whether SPEC names a config.json (or a shipped example) rather than module:function."""
    return spec.endswith(".json") or Path(spec).is_file() or spec in examples()


def _function(spec: str) -> Any:
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ModelSpecError(f"--model {spec!r} is neither a config.json (shipped examples: "
                             f"{', '.join(examples())}) nor module:function")
    try:
        if where.endswith(".py"):
            loader = importlib.util.spec_from_file_location(Path(where).stem, where)
            if loader is None or not Path(where).is_file():
                raise ModelSpecError(f"--model {spec!r}: no Python file at {where}")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())  # a module beside the user, as `python -m` would find it
            try:
                module = importlib.import_module(where)
            finally:
                sys.path.remove(os.getcwd())
    except ImportError as exc:
        raise ModelSpecError(f"--model {spec!r}: cannot import {where} ({exc})") from None
    if not callable(getattr(module, name, None)):
        raise ModelSpecError(f"--model {spec!r}: {where} has no function {name!r}")
    return getattr(module, name)


def _captured(spec: str, call: Any, tokens: int | None) -> tuple[list[tuple[int | None, str, GemmProblem, int]], list]:
    import torch

    from graphs.capture import capture_model

    got = call(tokens=tokens) if tokens is not None else call()
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.nn.Module)):
        raise ModelSpecError(f"--model {spec!r} must return (nn.Module, example_inputs), got {type(got).__name__}")
    module, inputs = got
    gemms, left_out = capture_model(module, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,))
    return [(tokens, g.problem.layer, g.problem, 1) for g in gemms], left_out


def model_gemm_list(spec: str, tokens: Sequence[int] | None, dtype: str) -> tuple[str, list, list[tuple[str, str]]]:
    """(model name, [(tokens, layer, problem, calls per forward)], [(what, why) skipped]) of a SPEC."""
    if is_config(spec):
        model = load_config(spec)
        return model.name, _config_calls(model, tokens, dtype), skipped(model)
    call = _function(spec)
    if "tokens" not in inspect.signature(call).parameters:
        if tokens:
            raise ModelSpecError(f"--model {spec!r} takes no `tokens` argument: its example inputs set the "
                                 "shapes, so leave --tokens out")
        found, left_out = _captured(spec, call, None)
        return spec, found, left_out
    calls, left_out = [], []
    for t in tokens or DEFAULT_TOKENS:
        found, more = _captured(spec, call, t)
        calls += found
        left_out += [s for s in more if s not in left_out]
    return spec, calls, left_out


def _config_calls(model: Any, tokens: Sequence[int] | None, dtype: str) -> list[tuple[int, str, GemmProblem, int]]:
    return [(t, g.layer, g.problem, g.count) for t in (tokens or DEFAULT_TOKENS) for g in model_gemms(model, t, dtype)]


def distinct_rows(calls: list[tuple[int | None, str, GemmProblem, int]]) -> list[dict]:
    """One row per (token count, computation), its layers in first-seen order and its calls counted."""
    rows: dict[tuple, dict] = {}
    for tokens, layer, problem, count in calls:
        row = rows.setdefault((tokens, problem.key), {"tokens": tokens, "layers": [], "calls": 0, "problem": problem})
        row["calls"] += count
        if layer not in row["layers"]:
            row["layers"].append(layer)
    return list(rows.values())


@dataclasses.dataclass(frozen=True)
class ModelRows:
    """What `tune --model` and `finetune --model` read of a SPEC."""

    name: str
    rows: list[dict]  # `distinct_rows`: tokens, layers, calls, problem
    skipped: list[tuple[str, str]]
    source: Path  # the config.json or Python file that defines the model: what a run's record digests
    config: Any = None  # the parsed config.json (graphs.model_config.ModelSpec); None for module:function


def model_rows(spec: str, tokens: str, dtype: str, tp: int = 1) -> ModelRows:
    """A SPEC's distinct GEMMs per token count (`tokens` as --tokens gives it; empty: DEFAULT_TOKENS),
    one GPU's share of them under `tp`-way tensor parallelism (`graphs.model_config.sharded`)."""
    counts = parse_tokens(tokens) if tokens else None
    if is_config(spec):
        config = sharded(load_config(spec), tp)
        return ModelRows(config.name, distinct_rows(_config_calls(config, counts, dtype)), skipped(config),
                         config_path(spec), config)
    if tp != 1:
        raise ModelSpecError(f"--tp splits a config.json's GEMMs as vLLM does; --model {spec!r} is traced, and its "
                             "example inputs set its shapes: leave --tp out")
    name, calls, left_out = model_gemm_list(spec, counts, dtype)
    where = spec.rpartition(":")[0]  # model_gemm_list imported it, so a module is in sys.modules by now
    source = Path(where) if where.endswith(".py") else Path(sys.modules[where].__file__)
    return ModelRows(name, distinct_rows(calls), left_out, source)


def epilogue(problem: GemmProblem) -> str:
    parts = ["bias" if problem.bias else "", problem.activation or "", "residual" if problem.residual else ""]
    return "+".join(p for p in parts if p) or "-"


def shape(problem: GemmProblem) -> str:
    return (f"{problem.batch}x" if problem.batch > 1 else "") + f"{problem.m}x{problem.n}x{problem.k}"


def gpu_of(name: str) -> Any:
    """The named spec, else the local GPU's, else the H200's (what `tune` ranks for)."""
    import torch

    import hardware_specs

    if name:
        return hardware_specs.load(name)
    return hardware_specs.detect() if torch.cuda.is_available() else hardware_specs.load("h200")


def run(args: Any) -> dict:
    """`tune --model`: rows of first picks (and, with args.measure, their times against cuBLAS)."""
    from gnn_policy import calibration
    from gnn_policy.calibration_level import displayed
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
    from gnn_policy.tune import significant

    if args.measure:
        _need_cuda()
    model = model_rows(args.model, args.tokens, args.dtype, args.tp)
    gpu = gpu_of(args.gpu)
    checkpoint = args.checkpoint or DEFAULT_CHECKPOINT
    policy, fits = Policy.load(checkpoint), calibration.load(checkpoint)
    rows, fitted = model.rows, False
    if rows:  # the first call builds the GPU's validity mask: keep it out of the time per pick
        policy.top_k(rows[0]["problem"], gpu, 1)
    start = time.perf_counter()
    for row in rows:
        problem = row.pop("problem")
        pick = policy.top_k(problem, gpu, 1)[0]
        if pick.measured:  # a fine-tune measured it on this GPU: shown as measured
            tflops = pick.predicted_tflops
        else:
            tflops, calibrated = displayed([pick.predicted_tflops], problem, gpu, fits, policy)[0]
            fitted = fitted or calibrated  # as `tune` says it: whether any shown prediction is calibrated
        row.update(shape=shape(problem), problem=problem.key, layouts=f"{problem.a_layout}/{problem.b_layout}",
                   epilogue=epilogue(problem), pick=pick.config.key, predicted_tflops=significant(tflops),
                   finetune_measured=pick.measured)
    out = {"model": model.name, "tp": args.tp, "gpu": gpu.name, "checkpoint": str(checkpoint), "calibrated": fitted,
           "picks_ms": round(1e3 * (time.perf_counter() - start), 1), "rows": rows,
           "skipped": [{"what": what, "why": why} for what, why in model.skipped]}
    if args.measure:
        out["totals"] = measure_rows(rows, gpu)
    return out


def _need_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise ModelSpecError("--measure needs a CUDA GPU; without one, tune only predicts")


def measure_rows(rows: list[dict], gpu: Any) -> list[dict]:
    """Time every row's pick and cuBLAS (plus its epilogue in torch) on the local GPU; returns
    the model's GEMM time per token count both ways, each row weighed by its calls."""
    _need_cuda()
    from gnn_policy.measure.runner import measure_configs
    from gnn_policy.space import TileConfig

    totals: dict[Any, dict] = {}
    for row in rows:
        problem = GemmProblem.from_key(row["problem"])
        pick, cublas = measure_configs(problem, [TileConfig.from_key(row["pick"]), None], gpu=gpu.name)
        for name, m in (("pick", pick), ("cublas", cublas)):
            row[f"{name}_ms"] = round(m.median_ms, 4) if m.status == "ok" else m.status
        total = totals.setdefault(row["tokens"], {"tokens": row["tokens"], "pick_ms": 0.0, "cublas_ms": 0.0,
                                                  "rows_failed": 0})
        if pick.status == "ok" and cublas.status == "ok":
            row["vs_cublas"] = round(cublas.median_ms / pick.median_ms, 3)
            total["pick_ms"] += row["calls"] * pick.median_ms
            total["cublas_ms"] += row["calls"] * cublas.median_ms
        else:
            total["rows_failed"] += 1
    for total in totals.values():
        total["vs_cublas"] = round(total["cublas_ms"] / total["pick_ms"], 3) if total["pick_ms"] else None
        total["pick_ms"], total["cublas_ms"] = round(total["pick_ms"], 4), round(total["cublas_ms"], 4)
    return list(totals.values())


def table(out: dict) -> str:
    """The rows as a text table, then what was skipped and, when measured, the totals."""
    from gnn_policy.tune import MEASURED_NOTE

    figure = "calibrated" if out["calibrated"] else "not calibrated for this GPU and dtype: capped at the roofline"
    share = f" (one GPU's share at --tp {out['tp']})" if out.get("tp", 1) > 1 else ""
    lines = [f"{out['model']}{share} on {out['gpu']}: {len(out['rows'])} distinct GEMMs, picked in {out['picks_ms']} ms "
             f"(predicted TFLOP/s {figure})"]
    measured = "totals" in out
    head = ["tokens", "layers", "calls", "shape", "A/B", "epilogue", "first pick", "pred TF/s"]
    head += ["pick ms", "cuBLAS ms", "speedup"] if measured else []
    cells = [head]
    for r in out["rows"]:
        cells.append([str(r["tokens"] if r["tokens"] is not None else "-"), ", ".join(r["layers"]), str(r["calls"]),
                      r["shape"], r["layouts"], r["epilogue"], r["pick"] + ("*" if r.get("finetune_measured") else ""),
                      f"{r['predicted_tflops']:g}"]
                     + ([str(r["pick_ms"]), str(r["cublas_ms"]), str(r.get("vs_cublas", "-"))] if measured else []))
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    if any(r.get("finetune_measured") for r in out["rows"]):
        lines.append(MEASURED_NOTE)
    lines += [f"skipped: {s['what']}: {s['why']}" for s in out["skipped"]]
    for t in out.get("totals", []):
        failed = f" ({t['rows_failed']} rows failed, left out)" if t["rows_failed"] else ""
        lines.append(f"tokens {t['tokens']}: model GEMM time {t['pick_ms']} ms with the picks, "
                     f"{t['cublas_ms']} ms with cuBLAS: {t['vs_cublas']}x{failed}")
    return "\n".join(lines)
