"""The simple pickers every learned one is compared with, as configs for one problem.

- `default_pick`: `ops.default_config`, as `gnn_policy.matmul` runs it: where the problem's
  strides rule TMA out, matmul falls back to pointer loads, and so does this.
- `analytic_pick`: the fitted analytic time model's fastest valid config of a space.
- `fits`: whether a config (in a space or not) is valid for one problem.
The named lists (tutorial, Inductor, seed) are `gnn_policy.space.NAMED_LISTS`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from graphs import GemmProblem
from hardware_specs import GpuSpec
from gnn_policy.space import TMA_VARIANTS, ConfigSpace, TileConfig, tma_fits, violations

ANALYTIC = Path(__file__).resolve().parent.parent / "checkpoints" / "analytic.json"


def config_fits(config: TileConfig, gpu: GpuSpec, problem: GemmProblem) -> bool:
    """The GPU rules and the TMA stride rule for one config, without a space's problem mask."""
    return not violations(config, gpu, problem.dtype, problem.k) and (
        config.variant not in TMA_VARIANTS or tma_fits(problem))


def fits(space_: ConfigSpace, gpu: GpuSpec, problem: GemmProblem, mask: Any = None) -> Callable[[TileConfig], bool]:
    """A test of validity for `problem`: the space's problem mask (`mask`, when the caller has it)
    for its points; the GPU rules and the TMA stride rule for configs outside it (a named list's)."""
    mask = space_.problem_mask(gpu, problem) if mask is None else mask

    def ok(c: TileConfig) -> bool:
        if c in space_:
            return bool(mask[space_.index(c)])
        return config_fits(c, gpu, problem)

    return ok


def default_pick(problem: GemmProblem, gpu: GpuSpec, ok: Callable[[TileConfig], bool]) -> TileConfig:
    """`default_config`, with pointer loads where `ok` (a `fits` test) rules its variant out."""
    from gnn_policy.ops import default_config

    c = default_config(problem.m, problem.n, problem.k, problem.dtype, gpu, problem.batch)
    return c if ok(c) else dataclasses.replace(c, variant="ptr")


def analytic_pick(problem: GemmProblem, gpu: GpuSpec, space_: ConfigSpace, model) -> TileConfig | None:
    """The `AnalyticModel`'s fastest config among the space's valid ones (None: none valid).

    About 0.3-0.6 s a problem on a CPU core: it scores every valid point."""
    from gnn_policy.search import valid_configs

    valid = valid_configs(space_, gpu, problem)
    if not valid:
        return None
    scores = model.predict_tflops(problem, valid, gpu)
    return valid[max(range(len(valid)), key=scores.__getitem__)]
