"""Measurements answered from a database's stored real rows: a CPU dry run on real labels.

`finetune --replay DB` adapts a policy to a GPU that is not here by looking up what DB
measured on it, so fine-tune settings can be chosen on real labels without GPU time. Only
the stored configs can be answered, so the candidates are limited to them: for the H200's
snapshot, about 320 configs a problem (200 stratified random ones plus the named lists),
not the whole space a real run searches.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from graphs import GemmProblem
from gnn_policy.measure.result import CUBLAS, Measurement
from gnn_policy.space import TileConfig


class ReplayError(RuntimeError):
    """The replay database cannot answer: no rows of the GPU, or a config it never measured."""


class ReplayPool:
    """A WorkerPool look-alike that returns one row per stored (problem, config) of one GPU.

    A correct config answers with the figure `Database.tflops` gives it (re-timings included,
    the best across software versions), the one best known is made of; a config with failed
    rows alone answers with one of them.
    """

    def __init__(self, path: str | Path, gpu: str) -> None:
        from gnn_policy.database import Database

        if not Path(path).exists():
            raise ReplayError(f"--replay {path} does not exist")
        versions = f"replay of {Path(path).name}"
        self.stored: dict[str, dict[str, Measurement]] = {}
        with Database(path) as db:
            for p in db.problems(gpu):
                figures = db.tflops(gpu, p.key)
                figures.pop(CUBLAS, None)
                self.stored[p.key] = {k: Measurement(gpu, p.key, k, "ok", median_ms=p.flops / (tf * 1e9), tflops=tf,
                                                     versions=versions) for k, tf in figures.items()}
            for row in db.rows_after(0):
                if row["gpu"] == gpu and row["source"] == "real" and row["status"] != "ok" and row["config"] != CUBLAS:
                    self.stored.setdefault(row["problem"], {}).setdefault(row["config"], Measurement(
                        gpu, row["problem"], row["config"], row["status"], error=row["error"], versions=versions))
        if not self.stored:
            raise ReplayError(f"--replay {path} holds no real rows of {gpu}")

    def offers(self, problem: GemmProblem) -> set[str]:
        """The config keys a replay can answer for this problem."""
        return set(self.stored.get(problem.key, ()))

    def figures(self, problem: GemmProblem) -> dict[str, float]:
        """TFLOP/s of each correct stored config of this problem (best known is the largest)."""
        return {k: m.tflops for k, m in self.stored.get(problem.key, {}).items() if m.status == "ok"}

    def run(self, problem: GemmProblem, configs: Sequence[TileConfig]) -> Iterator[Measurement]:
        rows = self.stored.get(problem.key, {})
        for c in configs:
            if c.key not in rows:
                raise ReplayError(f"{problem.key} {c.key} was never measured: a replay can only ask for offers()")
            yield rows[c.key]
