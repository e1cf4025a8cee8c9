"""Budgeted search: propose configs, measure them for real (or take them from the database), stop
at the budget. The searches every tuner is compared with live here.

A search returns its trace: the configs in the order it measured them, with their TFLOP/s
(None for a failed config). The best of the first k entries is what that tuner knows after
k measurements.
"""
from __future__ import annotations

import random
from collections import defaultdict
from typing import Sequence

from graphs import GemmProblem
from hardware_specs import GpuSpec
from gnn_policy.space import ConfigSpace, TileConfig, violations

Trace = list[tuple[TileConfig, "float | None"]]


class Measurer:
    """Measures (problem, config) pairs on the local GPU through the collect machinery, reusing
    what the database already holds and storing what it measures. `compiler` (a CompilePool,
    or None to let the measuring worker compile) stays alive across calls. `counts` gathers
    the run's tallies (measured, compile seconds, ...), a defaultdict(int)."""

    def __init__(self, db, gpu: GpuSpec, pool, compiler, counts: defaultdict, source: str = "real"):
        self.db, self.gpu, self.pool, self.compiler, self.counts = db, gpu, pool, compiler, counts
        self.source = source  # "simulated" with a SimulatedPool

    def __call__(self, problem: GemmProblem, configs: Sequence[TileConfig]) -> list[float | None]:
        from gnn_policy.collect import take_compiled

        tried = self.db.measured(self.gpu.name, self.source, problem=problem.key)
        todo = [c for c in dict.fromkeys(configs) if (problem.key, c.key) not in tried]
        if todo:
            compiled = self.compiler.stream((problem, c) for c in todo) if self.compiler else None
            rows, measure = take_compiled(problem, todo, compiled, self.gpu.name, self.counts)
            rows += [(m, problem, c) for m, c in zip(self.pool.run(problem, measure), measure)]
            self.counts["measured"] += self.db.add(rows)
        known = self.db.tflops(self.gpu.name, problem.key, self.source)
        return [known.get(c.key) for c in configs]


def valid_configs(space_: ConfigSpace, gpu: GpuSpec, problem: GemmProblem) -> list[TileConfig]:
    mask = space_.problem_mask(gpu, problem).flatten().tolist()
    return [c for c, ok in zip(space_, mask) if ok]


def fixed_list(configs: Sequence[TileConfig], gpu: GpuSpec, problem: GemmProblem, budget: int,
               measure: Measurer) -> Trace:
    """A named list in its own order (what `triton.autotune` over it measures), valid configs only."""
    chosen = [c for c in configs if not violations(c, gpu, problem.dtype, problem.k)][:budget]
    return list(zip(chosen, measure(problem, chosen)))


def random_search(valid: Sequence[TileConfig], problem: GemmProblem, budget: int, measure: Measurer,
                  rng: random.Random) -> Trace:
    chosen = rng.sample(list(valid), min(budget, len(valid)))
    return list(zip(chosen, measure(problem, chosen)))


def mutate(c: TileConfig, space_: ConfigSpace, rng: random.Random) -> TileConfig:
    """One knob moved to a neighbouring value."""
    name, values = rng.choice(space_.knobs)
    i = values.index(getattr(c, name))
    j = min(len(values) - 1, max(0, i + rng.choice((-1, 1))))
    return space_.at(tuple(j if n == name else vs.index(getattr(c, n)) for n, vs in space_.knobs))


def _crossover(a: TileConfig, b: TileConfig, space_: ConfigSpace, rng: random.Random) -> TileConfig:
    return space_.at(tuple(vs.index(getattr(rng.choice((a, b)), n)) for n, vs in space_.knobs))


def evolutionary_search(valid: Sequence[TileConfig], space_: ConfigSpace, problem: GemmProblem, budget: int,
                        measure: Measurer, rng: random.Random, population: int = 8) -> Trace:
    """The seed's loop without a prior: a random population, then generations bred from the
    top 20% (at least 2) by mutation and crossover; only valid, unseen configs are measured."""
    allowed = set(valid)
    trace: Trace = random_search(valid, problem, min(population, budget), measure, rng)
    seen = {c for c, _ in trace}
    while len(trace) < budget and len(seen) < len(allowed):
        ranked = sorted((t for t in trace if t[1] is not None), key=lambda t: -t[1])
        elites = [c for c, _ in ranked[:max(2, len(ranked) // 5)]] or [rng.choice(list(allowed))]
        children: list[TileConfig] = []
        for _ in range(50 * population):
            if len(children) >= min(population, budget - len(trace)):
                break
            child = (_crossover(*rng.sample(elites, 2), space_, rng) if len(elites) > 1 and rng.random() < 0.5
                     else mutate(rng.choice(elites), space_, rng))
            if child in allowed and child not in seen:
                seen.add(child)
                children.append(child)
        if not children:  # the elites' neighbourhood is used up: a random newcomer
            children = [rng.choice([c for c in valid if c not in seen])]
            seen.add(children[0])
        trace += list(zip(children, measure(problem, children)))
    return trace[:budget]
