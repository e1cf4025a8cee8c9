"""Meta-learning tasks: one GPU each, with its training samples (DESIGN §4, §5).

A task is a GPU and what is known of its speed on the training problems (`graphs.classes.ROLES`
["train"]: the train families and random-train), from up to three sources:
- real: the GPU's correct measurements in the database of those problems. Today that is the
  H200; an SM slice (`H200-SXM-141GB-sm64`) becomes a task as soon as the database has rows for it;
- simulated: for each problem the caller gives, a stratified, seeded sample of valid configs
  timed by the analytic model (checkpoints/analytic-slices.json by default), built in memory;
- imported: the vLLM / SGLang winners for the GPU (`training.imported`), imitation targets.
A GPU with real rows takes them instead of simulated ones: two label sets of one GPU would
disagree, and the measured one is what the simulator only approximates. Imported
demonstrations join either.

Held-out GPUs are in no task, from any source. Their simulated samples serve only validation
(`HeldOut`): a few adaptation steps on training problems, then validation problems scored.
An SM slice of a held-out GPU is another GPU (fewer SMs) and stays a task unless it is held
out too. Simulated problems of the wrong role are refused, so no test problem can enter.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import random
from typing import Sequence

import torch

import hardware_specs
from graphs import GemmProblem
from graphs.build import problem_graph
from graphs.classes import ROLES, split_of
from hardware_specs import GpuSpec, SpecError
from gnn_policy.collect import select_problems
from gnn_policy.pools import config_pool, stratified_configs
from gnn_policy.database import Database
from gnn_policy.measure.simulator import AnalyticModel
from gnn_policy.space import TMA_VARIANTS, ConfigSpace, TileConfig, fits_k, tma_fits
from training.dataset import Sample, demonstration_samples, load_samples
from training.imported import Demonstration

POOL = 1000  # configs per (GPU, dtype) the simulated samples draw from, as `gnn-policy collect --pool` does


class TaskError(ValueError):
    """The GPU lists leave no task to meta-train on, or no held-out GPU to validate on."""


@dataclasses.dataclass
class Task:
    gpu: str  # canonical GpuSpec name
    source: str  # where `samples` come from: real, simulated, or none (imported demonstrations only)
    samples: list[Sample]  # with timings: listwise and cost-head losses
    demos: list[Sample]  # imported demonstrations: imitation loss

    def card(self) -> dict:
        return {"gpu": self.gpu, "source": self.source, "problems": len(self.samples),
                "configs": sum(len(s.configs) for s in self.samples),
                "demonstrations": sum(len(d.configs) for d in self.demos)}


@dataclasses.dataclass
class HeldOut:
    """A held-out GPU's validation data, simulated."""

    gpu: str
    support: list[Sample]  # training problems: what the adaptation steps see
    query: list[Sample]  # validation problems: what the policy is scored on before and after


@dataclasses.dataclass(frozen=True)
class Simulation:
    """How simulated samples are made: the analytic model times `configs` valid configs per
    problem, sampled like a real collection (equal shares per (variant, SPLIT_K) group of a
    seeded pool), so simulated and real samples look alike to the policy."""

    analytic: AnalyticModel
    space: ConfigSpace
    configs: int = 64
    seed: int = 0

    def samples(self, gpu: GpuSpec, problems: Sequence[GemmProblem]) -> list[Sample]:
        pools: dict[str, list] = {}
        knobs = len(self.space.shape)
        out = []
        for p in problems:
            if p.dtype not in pools:
                mask = self.space.mask(gpu, p.dtype).flatten().tolist()
                pools[p.dtype] = config_pool([c for c, ok in zip(_points(self.space), mask) if ok], POOL, self.seed)
            fit = [c for c in pools[p.dtype] if fits_k(c, p.k) and (c.variant not in TMA_VARIANTS or tma_fits(p))]
            chosen = stratified_configs(fit, self.configs, random.Random(f"{self.seed}:{gpu.name}:{p.key}"))
            tflops = self.analytic.predict_tflops(p, chosen, gpu)
            out.append(Sample(problem=p, gpu=gpu.name, graph=problem_graph(p),
                              configs=torch.tensor([self.space.index(c) for c in chosen]),
                              log_tflops=torch.tensor([math.log(t) for t in tflops]),
                              failed=torch.zeros(0, knobs, dtype=torch.long)))
        return out


@functools.lru_cache(maxsize=4)
def _points(space_: ConfigSpace) -> tuple[TileConfig, ...]:
    """Every config of the space in mask order, built once: iterating the space costs 0.3 s a pass."""
    return tuple(space_)


def canonical(names: Sequence[str], what: str) -> tuple[str, ...]:
    """Canonical GpuSpec names of `names` (aliases and SM slices resolved), without repeats;
    an unknown name is a SpecError that says which list (`what`) holds it."""
    out = []
    for name in names:
        try:
            out.append(hardware_specs.load(name).name)
        except SpecError as exc:
            raise SpecError(f"{what}: {exc} (or an SM slice such as h200-sm64)") from None
    return tuple(dict.fromkeys(out))


def role_problems(role: str, count: int, random_count: int, seed: int) -> list[GemmProblem]:
    """Problems of a role of `graphs.classes.ROLES` to simulate: `count` of its suite split,
    spread over the families (0: all), then the first `random_count` of its random split (0: none)."""
    family, random_split = ROLES[role]
    return select_problems(family, count, seed) + (select_problems(random_split, random_count, seed)
                                                   if random_count else [])


def _check_role(problems: Sequence[GemmProblem], role: str, what: str) -> None:
    """Refuse `problems` outside the role's splits: a test problem in a task or a validation
    query would leak into training or into the choice of weights."""
    stray = sorted({split_of(p) for p in problems} - set(ROLES[role]))
    if stray:
        raise TaskError(f"{what} must be {role} problems ({', '.join(ROLES[role])}); got some of {', '.join(stray)}")


def real_samples(db: Database, space_: ConfigSpace, skip: Sequence[str],
                 named_weight: float = 1.0) -> dict[str, list[Sample]]:
    """Samples of the training problems (train families and random-train) of every GPU with
    correct real rows in `db`, except `skip`; rows of the named lists weigh `named_weight`
    (`training.dataset`)."""
    gpus = [name for name, counts in db.stats()["gpus"].items() if counts["real_ok"] and name not in skip]
    found = {gpu: load_samples(db, [gpu], space_, ROLES["train"], named_weight) for gpu in gpus}
    return {gpu: samples for gpu, samples in found.items() if samples}


def build_tasks(hold_out: Sequence[str], simulate: Sequence[str], sim: Simulation, problems: Sequence[GemmProblem],
                db: Database | None = None, demos: Sequence[Demonstration] = (),
                named_weight: float = 1.0) -> list[Task]:
    """One task per GPU that is not held out: real rows of `db` (None: no real tasks), else
    simulated on `problems` where `simulate` names it, plus its demonstrations of training problems."""
    _check_role(problems, "train", "simulated tasks' problems")
    held = canonical(hold_out, "--hold-out")
    simulated = [g for g in canonical(simulate, "--simulate") if g not in held]
    real = real_samples(db, sim.space, held, named_weight) if db is not None else {}
    imported: dict[str, list[Sample]] = {}
    for s in demonstration_samples([d for d in demos if d.gpu not in held], sim.space, ROLES["train"]):
        imported.setdefault(s.gpu, []).append(s)
    gpus = sorted({*simulated, *real, *imported})
    if not gpus:
        raise TaskError(f"no task is left after the hold-out ({', '.join(held) or 'none'}): every GPU to simulate, "
                        "with real rows in the database or with imported configs is held out")
    tasks = []
    for gpu in gpus:
        if gpu in real:
            source, samples = "real", real[gpu]
        elif gpu in simulated:
            source, samples = "simulated", sim.samples(hardware_specs.load(gpu), problems)
        else:
            source, samples = "none", []
        tasks.append(Task(gpu, source, samples, imported.get(gpu, [])))
    return tasks


def held_out(hold_out: Sequence[str], sim: Simulation, support: Sequence[GemmProblem],
             query: Sequence[GemmProblem]) -> list[HeldOut]:
    """Validation data of each held-out GPU: simulated `support` (training) and `query`
    (validation) problems. At least one GPU must be held out: adapting to it is what
    validation measures."""
    if not hold_out:
        raise TaskError("hold out at least one GPU (--hold-out): validation measures adaptation to it")
    _check_role(support, "train", "the held-out GPUs' support problems")
    _check_role(query, "val", "the held-out GPUs' query problems")
    return [HeldOut(gpu, sim.samples(spec, support), sim.samples(spec, query))
            for gpu, spec in ((g, hardware_specs.load(g)) for g in canonical(hold_out, "--hold-out"))]
