"""Problem classes and splits that every report names the same way (DESIGN.md section 6).

A problem can be in several classes:

- decode: M <= 64 (a server's decode batch; one row of tiles at most BLOCK_M 64).
- prefill: M > 64.
- skinny: a prefill problem whose output is at least 16 times longer than it is wide
  (max(M, N) >= 16 min(M, N)): one tile dimension dominates and the grid is a thin strip.
- short K: K <= 256, at most four BLOCK_K-64 steps: the load pipeline (up to 6 stages) never
  fills and split-K has little to split.
- unaligned: N or K is not a multiple of 16 (the random generator's "multiple of 8, not 16"
  and odd classes): masked tails and, for odd sizes, rows TMA cannot load.
- column-major B: B stored [N, K] (`x @ W.T` with an `nn.Linear` weight).
- batched: batch > 1.
"""
from __future__ import annotations

from graphs.problem import GemmProblem
from graphs.random_gemms import MODEL, SPLITS as RANDOM_SPLITS, split_of_shape
from graphs.suite import SPLITS as FAMILY_SPLITS

CLASSES = ("decode", "prefill", "skinny", "short K", "unaligned", "column-major B", "batched")
DECODE_M, SKINNY_RATIO, SHORT_K, ALIGN = 64, 16, 256, 16
ALL_SPLITS = (*FAMILY_SPLITS, *RANDOM_SPLITS, "other")
# What training reads as its train, val and test problems: a suite split and the random split of
# the same role. "other" is in none: a tuned shape or a captured layer was never drawn for a split.
ROLES = {"train": ("train", "random-train"), "val": ("val", "random-val"), "test": ("test", "random-test")}


def classes(p: GemmProblem) -> tuple[str, ...]:
    """The classes of `p`, in `CLASSES` order."""
    member = {
        "decode": p.m <= DECODE_M,
        "prefill": p.m > DECODE_M,
        "skinny": p.m > DECODE_M and max(p.m, p.n) >= SKINNY_RATIO * min(p.m, p.n),
        "short K": p.k <= SHORT_K,
        "unaligned": p.n % ALIGN != 0 or p.k % ALIGN != 0,
        "column-major B": p.b_layout == "col",
        "batched": p.batch > 1,
    }
    return tuple(c for c in CLASSES if member[c])


def split_of(p: GemmProblem) -> str:
    """The split a stored problem belongs to: its family's suite split, its random split by hash,
    or 'other' (a shape someone tuned, a captured module's layer)."""
    if p.model == MODEL:
        return split_of_shape(p)
    return next((name for name, families in FAMILY_SPLITS.items() if p.model in families), "other")
