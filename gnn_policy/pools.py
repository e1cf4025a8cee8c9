"""The configs a collection draws from: stratified samples, nested seeded pools, kernel classes.

Compiling a kernel costs a CPU core about half a second, timing it tens of milliseconds, so a
collection is only as fast as its kernels are shared. Triton compiles one kernel per
specialisation: the dtype, the epilogue, the layouts, and whether each size and stride is a
multiple of 16. `kernel_class` names that specialisation for a problem; problems of one class
that draw from one pool share their kernels, and measured class by class (`class_order`) they
share them within one machine's life, since its on-disk kernel cache goes with it.
"""
from __future__ import annotations

import hashlib
import itertools
import random
from collections import defaultdict
from typing import Any, Sequence

from graphs import GemmProblem
from gnn_policy.space import ConfigSpace, TileConfig


def _by_stratum(configs: Sequence[TileConfig]) -> dict[tuple, list[TileConfig]]:
    groups: dict[tuple, list[TileConfig]] = defaultdict(list)
    for c in configs:
        groups[(c.variant, c.split_k)].append(c)
    return groups


def stratified_configs(valid: Sequence[TileConfig], count: int, rng: random.Random) -> list[TileConfig]:
    """`count` configs of `valid`, an equal share from each (variant, SPLIT_K) group first."""
    groups = _by_stratum(valid)
    picked: list[TileConfig] = []
    share = max(1, count // max(1, len(groups)))
    for key in sorted(groups):
        picked += rng.sample(groups[key], min(share, len(groups[key])))
    taken = set(picked)
    rest = [c for c in valid if c not in taken]
    picked += rng.sample(rest, min(len(rest), max(0, count - len(picked))))
    return picked


def config_pool(valid: Sequence[TileConfig], size: int, seed: int | str) -> list[TileConfig]:
    """The first `size` configs of a seeded order that takes the (variant, SPLIT_K) groups in turn.

    Pools of one seed are nested (a larger pool holds every smaller one), so a dense sweep
    reuses the kernels of a sparse one. Size 0 or past the space: all of `valid`.
    """
    groups = _by_stratum(valid)
    rng = random.Random(f"pool:{seed}")
    queues = [rng.sample(groups[key], len(groups[key])) for key in sorted(groups)]
    order = [c for row in itertools.zip_longest(*queues) for c in row if c is not None]
    return order[:size] if size else order


def kernel_class(p: GemmProblem) -> str:
    """The part of a problem that selects its Triton specialisation, as a short name."""
    sixteen = "".join(name for name, size in (("m", p.m), ("n", p.n), ("k", p.k)) if size % 16 == 0)
    return (f"{p.dtype}/{p.a_layout[0]}{p.b_layout[0]}/{'bias' if p.bias else '-'}/{p.activation or '-'}/"
            f"{'res' if p.residual else '-'}/{'bmm' if p.batch > 1 else 'mm'}/16:{sixteen or '-'}"
            f"{'/m1' if p.m == 1 else ''}")


def class_order(problems: Sequence[GemmProblem], seed: int) -> list[GemmProblem]:
    """`problems` grouped by kernel class, the classes in a seeded order (so a run stopped part
    way has measured a random set of whole classes), each class in the order given."""
    groups: dict[str, list[GemmProblem]] = defaultdict(list)
    for p in problems:
        groups[kernel_class(p)].append(p)
    rank = {k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest() for k in groups}
    return [p for k in sorted(groups, key=rank.get) for p in groups[k]]


class ConfigPools:
    """The pool each problem draws its sample from: one per dtype, or with `by_class` one per
    kernel class (seeded by the class, so the classes together cover far more of the space
    than one pool would), with each config's flat index into the space's masks."""

    def __init__(self, space_: ConfigSpace, gpu, size: int, seed: int, by_class: bool = False):
        self.space, self.gpu, self.size, self.seed, self.by_class = space_, gpu, size, seed, by_class
        self._valid: dict[str, list[TileConfig]] = {}
        self._pools: dict[tuple[str, str], tuple[list[TileConfig], Any]] = {}

    def of(self, p: GemmProblem) -> tuple[list[TileConfig], Any]:
        import torch

        key = (p.dtype, kernel_class(p) if self.by_class else "")
        if key not in self._pools:
            if p.dtype not in self._valid:
                points = self.space.points
                mask = self.space.mask(self.gpu, p.dtype).flatten()
                self._valid[p.dtype] = [points[i] for i in mask.nonzero().flatten().tolist()]
            pool = config_pool(self._valid[p.dtype], self.size, f"{self.seed}:{key[1]}" if self.by_class else self.seed)
            self._pools[key] = pool, torch.tensor([self.space.flat_index(c) for c in pool], dtype=torch.long)
        return self._pools[key]
