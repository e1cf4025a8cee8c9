"""Random GEMMs: a seeded generator of the problems the suite lacks, split by a stable hash.

The suite (graphs/suite.py) is real model layers: row-major B and nearly every dimension a
multiple of 128. Users also call GEMMs with odd token counts, unaligned N and K,
`nn.Linear`'s column-major weight and batches. One draw of `draw`:

- M: log-uniform on [1, 16384]. Half the draws are model-like: below 64 the nearest power of
  two, from 64 on a power of two or a multiple of 64 (half each). The other half take the
  nearest integer, odd ones included.
- N and K, each: log-uniform on [16, 65536], then snapped to an alignment class: a multiple of
  128 (half; below 128 the nearest of 16, 32, 64), a multiple of 8 that is not one of 16 (a
  quarter; 24 to 65528) or an odd number (a quarter; 17 to 65535).
- B column-major for half the draws (`x @ W.T` with an `nn.Linear` weight [N, K]); A
  column-major for 15% of them.
- batch: 1 for 90% of the draws, else log-uniform on [2, 128] (attention-like bmm).
- dtype fp16 or bf16, half each; the epilogue (bias, activation, residual) from `EPILOGUES`,
  the suite's seven combinations at the suite's frequencies.
- Caps: at most `FLOP_CAP` FLOPs and `BYTES_CAP` bytes moved. A draw over either is drawn
  again whole, so sizes are log-uniform given the caps (a large M pairs with a small N or K).

Splits: `split_of_shape` hashes (sha256, not Python's salted `hash`) the shape and layouts,
leaving dtype and epilogue out: the fp16 and bf16 twins of one shape time alike, and splitting
them apart would leak the answer into the test split. 80% random-train, 10% random-val, 10%
random-test; the test split is never trained or tuned on. A draw whose computation the suite
already has is dropped: the family splits own it.

`problems(split, count, seed)` is the first `count` distinct problems of a split in the seed's
draw order, so a larger count extends a smaller one and a collection grows by resuming.
Anything changed here changes which problems exist: measured data names problems by key and
stays valid, but the same `--problems N` would then select others.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import math
import random
from typing import Callable, Iterator

from graphs.problem import GemmProblem

MODEL = "random"  # the `model` tag of every random problem
SPLITS = ("random-train", "random-val", "random-test")
_SPLIT_EDGES = (80, 90, 100)  # cumulative percent of the hash buckets per split
M_RANGE, NK_RANGE, BATCH_RANGE = (1, 16384), (16, 65536), (2, 128)
COL_B, COL_A, BATCHED = 0.5, 0.15, 0.1
# About 1 ms on an H200 at 500 TFLOP/s (bf16 dense peak ~990): a config at a tenth of that
# still times in ~10 ms, so 100 configs of the largest problem cost seconds, not minutes.
FLOP_CAP = 5e11
# About 1 ms of its 4.8 TB/s, the memory-bound side of the same budget. At 2 bytes an element
# it also keeps every operand under 2**31 elements, the template's 32-bit offsets.
BYTES_CAP = 4e9
# (bias, activation, residual, weight): the suite's combinations, weighted by its problem counts.
EPILOGUES = ((False, None, False, 724), (False, None, True, 280), (True, None, False, 196),
             (False, "silu", False, 112), (True, None, True, 56), (True, "gelu", False, 56),
             (False, "relu", False, 28))


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return lo * math.exp(rng.random() * math.log(hi / lo))


def _nearest_pow2(x: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, 2 ** round(math.log2(x))))


def _m(rng: random.Random) -> int:
    lo, hi = M_RANGE
    x = _log_uniform(rng, lo, hi + 1)
    if rng.random() < 0.5:  # model-like: token counts a server batches to
        if x < 64 or rng.random() < 0.5:
            return _nearest_pow2(x, lo, hi)
        return min(hi, max(64, round(x / 64) * 64))
    return min(hi, max(lo, int(x)))


def _nk(rng: random.Random) -> int:
    lo, hi = NK_RANGE
    x = _log_uniform(rng, lo, hi)
    u = rng.random()
    if u < 0.5:
        return _nearest_pow2(x, lo, 64) if x < 96 else min(hi, round(x / 128) * 128)
    if u < 0.75:  # 8 * odd: 16-byte rows (TMA can load them), but no 32-byte vectors
        return min(hi - 8, max(24, 8 * (2 * round((x / 8 - 1) / 2) + 1)))
    return min(hi - 1, max(lo + 1, 2 * round((x - 1) / 2) + 1))


def _epilogue(rng: random.Random) -> tuple[bool, str | None, bool]:
    u = rng.random() * sum(e[3] for e in EPILOGUES)
    for bias, act, res, weight in EPILOGUES:
        if u < weight:
            return bias, act, res
        u -= weight
    return EPILOGUES[-1][:3]


def within_caps(p: GemmProblem) -> bool:
    return p.flops <= FLOP_CAP and p.bytes_min() <= BYTES_CAP


def draw(rng: random.Random, layer: str = "") -> GemmProblem:
    """One problem of the module's distribution, drawn again whole until it is within the caps."""
    while True:
        m, n, k = _m(rng), _nk(rng), _nk(rng)
        b_layout = "col" if rng.random() < COL_B else "row"
        a_layout = "col" if rng.random() < COL_A else "row"
        batch = 1
        if rng.random() < BATCHED:
            batch = min(BATCH_RANGE[1], max(BATCH_RANGE[0], int(_log_uniform(rng, BATCH_RANGE[0], BATCH_RANGE[1] + 1))))
        dtype = "fp16" if rng.random() < 0.5 else "bf16"
        bias, act, res = _epilogue(rng)
        p = GemmProblem(m, n, k, batch=batch, dtype=dtype, a_layout=a_layout, b_layout=b_layout, bias=bias,
                        activation=act, residual=res, model=MODEL, layer=layer)
        if within_caps(p):
            return p


def split_of_shape(p: GemmProblem) -> str:
    """The random split of a problem's shape and layouts (dtype and epilogue left out)."""
    shape = f"{p.batch}x{p.m}x{p.n}x{p.k}_{p.a_layout}_{p.b_layout}"
    bucket = int.from_bytes(hashlib.sha256(shape.encode()).digest()[:8], "big") % 100
    return next(name for name, edge in zip(SPLITS, _SPLIT_EDGES) if bucket < edge)


@functools.lru_cache(maxsize=1)
def _suite_keys() -> frozenset[str]:
    from graphs.suite import suite

    return frozenset(p.key for ps in suite().values() for p in ps)


def stream(seed: int = 0) -> Iterator[GemmProblem]:
    """Every distinct problem of the seed's draws, in draw order, suite computations dropped."""
    rng = random.Random(f"random-gemms:{seed}")
    seen: set[str] = set()
    for i in itertools.count():
        p = draw(rng, layer=f"seed {seed} draw {i}")
        if p.key not in seen and p.key not in _suite_keys():
            seen.add(p.key)
            yield p


def problems(split: str, count: int, seed: int = 0,
             where: Callable[[GemmProblem], bool] | None = None) -> list[GemmProblem]:
    """The first `count` distinct problems of `split` in the seed's draw order (of those `where`
    accepts, when given)."""
    if split not in SPLITS:
        raise KeyError(f"unknown random split {split!r}; known: {', '.join(SPLITS)}")
    if count < 1:
        raise ValueError(f"a random split is endless: ask for a number of problems (got {count})")
    out = []
    for i, p in enumerate(stream(seed)):
        if split_of_shape(p) == split and (where is None or where(p)):
            out.append(p)
            if len(out) == count:
                return out
        if i >= 1000 * count + 100_000:  # a filter that (almost) nothing passes
            break
    raise ValueError(f"only {len(out)} of {count} {split} problems pass the filter in {i + 1} draws")
