"""Measurement: the outcome of one (gpu, problem, config) run, whatever happened."""
from __future__ import annotations

import dataclasses

STATUSES = ("ok", "compile_error", "out_of_resources", "wrong_result", "timeout", "crashed")
SOURCES = ("real", "simulated", "imported")
CUBLAS = "cublas"  # the config key of torch.matmul (+ the epilogue in torch) rows


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One row of the database. Times are per call; `config` is a TileConfig key or CUBLAS.

    `versions` names the software that produced it (torch, triton, driver): a row measured
    under other versions is another row, never an overwrite.
    """

    gpu: str
    problem: str
    config: str
    status: str
    source: str = "real"
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    tflops: float | None = None
    max_rel_err: float | None = None
    sm_mhz: int | None = None
    versions: str = ""
    error: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Measurement.status must be one of {STATUSES}, got {self.status!r}")
        if self.source not in SOURCES:
            raise ValueError(f"Measurement.source must be one of {SOURCES}, got {self.source!r}")
        if self.status == "ok" and (self.median_ms is None or self.tflops is None):
            raise ValueError("an ok Measurement needs median_ms and tflops")


@dataclasses.dataclass(frozen=True)
class Retime:
    """A later timing of a stored (gpu, problem, config): run `run`, round `round` of it.

    The configs that decide "best known" are timed again in separate runs, interleaved with
    each other and with cuBLAS, because their first timings drift by several percent.
    """

    gpu: str
    problem: str
    config: str
    run: str
    round: int
    status: str
    median_ms: float | None = None
    sm_mhz: int | None = None
    versions: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Retime.status must be one of {STATUSES}, got {self.status!r}")
        if self.status == "ok" and self.median_ms is None:
            raise ValueError("an ok Retime needs median_ms")
