"""Budgeted search: propose configs, measure them for real (or take them from the database), stop
at the budget. The searches every tuner is compared with live here.

A search is a generator: it yields a batch of configs to measure and receives their TFLOP/s
(None for a failed config) until it has spent its budget. `run_searches` drives many of them,
one per problem, in lockstep, so each step's batches of every problem compile together on
the CPU pool instead of one problem at a time. A search's trace lists the configs in the order
they were measured, with their TFLOP/s; the best of the first k entries is what that tuner
knows after k measurements.
"""
from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from typing import Generator, Sequence

from graphs import GemmProblem
from hardware_specs import GpuSpec
from gnn_policy.space import ConfigSpace, TileConfig, violations

Trace = list[tuple[TileConfig, "float | None"]]
Search = Generator[list[TileConfig], list["float | None"], None]


class Measurer:
    """Measures (problem, config) pairs on the local GPU through the collect machinery, reusing
    what the database already holds and storing what it measures. `compiler` (a CompilePool,
    or None to let the measuring worker compile) stays alive across calls. `counts` gathers
    the run's tallies (measured, compile seconds, ...), a defaultdict(int)."""

    def __init__(self, db, gpu: GpuSpec, pool, compiler, counts: defaultdict, source: str = "real"):
        self.db, self.gpu, self.pool, self.compiler, self.counts = db, gpu, pool, compiler, counts
        self.source = source  # "simulated" with a SimulatedPool

    def __call__(self, problem: GemmProblem, configs: Sequence[TileConfig]) -> list[float | None]:
        return self.many([(problem, configs)])[0]

    def many(self, jobs: Sequence[tuple[GemmProblem, Sequence[TileConfig]]]) -> list[list[float | None]]:
        """TFLOP/s of each job's configs. Every job's unmeasured configs go to the compile pool at
        once, so later problems compile while earlier ones are timed."""
        from gnn_policy.collect import take_compiled

        # two jobs may ask for one pair before either is stored: measure it once, both read its row
        todo, scheduled = [], set()
        for problem, configs in jobs:
            tried = self.db.measured(self.gpu.name, self.source, problem=problem.key) | scheduled
            todo.append([c for c in dict.fromkeys(configs) if (problem.key, c.key) not in tried])
            scheduled |= {(problem.key, c.key) for c in todo[-1]}
        compiled = None
        if self.compiler and any(todo):
            compiled = self.compiler.stream((problem, c) for (problem, _), cs in zip(jobs, todo) for c in cs)
        out = []
        for (problem, configs), cs in zip(jobs, todo):
            if cs:
                rows, measure = take_compiled(problem, cs, compiled, self.gpu.name, self.counts)
                rows += [(m, problem, c) for m, c in zip(self.pool.run(problem, measure), measure)]
                self.counts["measured"] += self.db.add(rows)
            known = self.db.tflops(self.gpu.name, problem.key, self.source)
            out.append([known.get(c.key) for c in configs])
        return out


@contextlib.contextmanager
def local_measurer(db, gpu: GpuSpec, counts: defaultdict, runner: str, timeout_s: float,
                   simulated=None) -> Generator[Measurer, None, None]:
    """A Measurer on this machine: the analytic model's `SimulatedPool` when `simulated` (a
    fitted analytic model) is given, else the measuring worker `runner`, with a compile pool
    ahead of it when the runner is ours and a GPU is there (a test's runner compiles nothing)."""
    from gnn_policy.measure.simulator import SimulatedPool

    if simulated is not None:
        yield Measurer(db, gpu, SimulatedPool(simulated, gpu), None, counts, source="simulated")
        return
    import torch

    from gnn_policy.measure.compile import CompilePool
    from gnn_policy.measure.workers import WorkerPool

    real = runner.startswith("gnn_policy.measure.runner:") and torch.cuda.is_available()
    with WorkerPool(runner, gpu=gpu.name, timeout_s=timeout_s) as pool, \
            (CompilePool() if real else contextlib.nullcontext()) as compiler:
        yield Measurer(db, gpu, pool, compiler, counts)


def run_searches(searches: Sequence[tuple[GemmProblem, Search]], measure: Measurer) -> list[Trace]:
    """Each search's trace; every step measures the pending batch of every search together."""
    traces: list[Trace] = [[] for _ in searches]
    pending = {i: batch for i, (_, search) in enumerate(searches) if (batch := next(search, None)) is not None}
    while pending:
        values = measure.many([(searches[i][0], batch) for i, batch in pending.items()])
        following = {}
        for (i, batch), got in zip(pending.items(), values):
            traces[i] += list(zip(batch, got))
            try:
                following[i] = searches[i][1].send(got)
            except StopIteration:
                pass
        pending = following
    return traces


def valid_configs(space_: ConfigSpace, gpu: GpuSpec, problem: GemmProblem) -> list[TileConfig]:
    points = space_.points
    return [points[i] for i in space_.problem_mask(gpu, problem).flatten().nonzero().flatten().tolist()]


def given(configs: Sequence[TileConfig]) -> Search:
    """One batch chosen beforehand: a policy's top picks, a model's ranking."""
    yield list(configs)


def fixed_list(configs: Sequence[TileConfig], gpu: GpuSpec, problem: GemmProblem, budget: int) -> Search:
    """A named list in its own order (what `triton.autotune` over it measures), valid configs only."""
    return given([c for c in configs if not violations(c, gpu, problem.dtype, problem.k)][:budget])


def random_search(valid: Sequence[TileConfig], budget: int, rng: random.Random) -> Search:
    yield rng.sample(list(valid), min(budget, len(valid)))


def mutate(c: TileConfig, space_: ConfigSpace, rng: random.Random) -> TileConfig:
    """One knob moved to a neighbouring value."""
    name, values = rng.choice(space_.knobs)
    i = values.index(getattr(c, name))
    j = min(len(values) - 1, max(0, i + rng.choice((-1, 1))))
    return space_.at(tuple(j if n == name else vs.index(getattr(c, n)) for n, vs in space_.knobs))


def _crossover(a: TileConfig, b: TileConfig, space_: ConfigSpace, rng: random.Random) -> TileConfig:
    return space_.at(tuple(vs.index(getattr(rng.choice((a, b)), n)) for n, vs in space_.knobs))


def evolutionary_search(valid: Sequence[TileConfig], space_: ConfigSpace, budget: int, rng: random.Random,
                        population: int = 8) -> Search:
    """The seed's loop without a prior: a random population, then generations bred from the
    top 20% (at least 2) by mutation and crossover; only valid, unseen configs are measured."""
    allowed = set(valid)
    first = rng.sample(list(valid), min(population, budget, len(valid)))
    trace: Trace = list(zip(first, (yield first)))
    seen = set(first)
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
        trace += list(zip(children, (yield children)))
