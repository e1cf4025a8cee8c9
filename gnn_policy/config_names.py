"""Meta-parameter names: read a `triton.Config` whatever a kernel calls its knobs, write one in a
chosen spelling.

Kernels name the same knobs differently: this project's template (`BLOCK_M`, `SPLIT_K`,
`GROUP_M`, `USE_TMA`), Triton's tutorial 03, vLLM and SGLang (`BLOCK_SIZE_M`, `GROUP_SIZE_M`),
and the short style (`BM`, `BN`, `BK`, `GM`). The template's own names are read and written
by `TileConfig.from_triton` / `to_triton`, which know its load variants. Other kernels are read
through every spelling of `SPELLINGS` (or an explicit `names` mapping from our knob names to
the kernel's); a config without a readable BLOCK_M, BLOCK_N and BLOCK_K is unreadable (None).
A config without a group knob is read as GROUP_M 1 (no swizzle), without a split knob as
SPLIT_K 1, and as pointer loads unless its `variant` knob (a TMA flag) is true.
"""
from __future__ import annotations

from typing import Any

from gnn_policy.space import TileConfig

KNOBS = ("block_m", "block_n", "block_k", "split_k", "group_m", "variant")
SPELLINGS: dict[str, dict[str, str]] = {
    "project": {"block_m": "BLOCK_M", "block_n": "BLOCK_N", "block_k": "BLOCK_K", "split_k": "SPLIT_K",
                "group_m": "GROUP_M", "variant": "USE_TMA"},  # written by TileConfig.to_triton
    # Triton's tutorial 03, and vLLM's and SGLang's tuned configs
    "tutorial": {"block_m": "BLOCK_SIZE_M", "block_n": "BLOCK_SIZE_N", "block_k": "BLOCK_SIZE_K",
                 "group_m": "GROUP_SIZE_M"},
    "short": {"block_m": "BM", "block_n": "BN", "block_k": "BK", "group_m": "GM"},
}
_EXTRA = {"split_k": ("SPLITK", "SPLIT_K_SIZE"), "group_m": ("GROUP_SIZE",)}
_DEFAULTS = {"split_k": 1, "group_m": 1}


def _accepted(knob: str) -> list[str]:
    seen = [s[knob] for s in SPELLINGS.values() if knob in s] + list(_EXTRA.get(knob, ()))
    return list(dict.fromkeys(seen))


def check_names(names: dict[str, str]) -> dict[str, str]:
    """An explicit mapping {our knob: the kernel's name}, checked (e.g. {'block_m': 'TILE_M', ...})."""
    unknown = sorted(set(names) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown knobs {unknown} in names; the knobs are {list(KNOBS)}")
    return dict(names)


def read(config: Any, names: dict[str, str] | None = None) -> TileConfig | None:
    """The TileConfig of a `triton.Config`; None when its tile sizes cannot be read."""
    kw = config.kwargs
    if names is None and "BLOCK_M" in kw and "SPLIT_K" in kw:  # the template's own: space.py reads it
        try:
            return TileConfig.from_triton(config)
        except (KeyError, TypeError, ValueError):
            return None
    values: dict[str, Any] = {}
    for knob in KNOBS:
        spellings = [names[knob]] if names and knob in names else _accepted(knob)
        found = [kw[s] for s in spellings if s in kw]
        if found:
            values[knob] = found[0]
    if not {"block_m", "block_n", "block_k"} <= set(values):
        return None
    variant = "tma" if values.pop("variant", False) else "ptr"
    try:
        return TileConfig(**{**_DEFAULTS, **values}, num_warps=config.num_warps,
                          num_stages=config.num_stages, variant=variant)
    except (TypeError, ValueError):  # not powers of two, not ints: not a tile this space knows
        return None


def expressible(tile: TileConfig, spelling: str) -> bool:
    """Whether a kernel of this spelling has every knob the config needs (split-K, a load variant)."""
    if spelling == "project":
        return True
    return (tile.split_k == 1 or "split_k" in SPELLINGS[spelling]) and tile.variant == "ptr"


def kwargs(tile: TileConfig, spelling: str) -> dict[str, Any]:
    """The config's meta-parameters in a spelling; knobs the spelling lacks must be at their defaults."""
    if spelling == "project":
        return dict(tile.to_triton().kwargs)
    if not expressible(tile, spelling):
        raise ValueError(f"{tile.key} needs split-K or a {tile.variant} load variant, which {spelling!r} kernels lack")
    names = SPELLINGS[spelling]
    return {names[k]: getattr(tile, k) for k in ("block_m", "block_n", "block_k", "split_k", "group_m") if k in names}


def source(tile: TileConfig, spelling: str) -> str:
    """Python source of the `triton.Config` (what `gnn-policy export --format triton` writes)."""
    inner = ", ".join(f"{k!r}: {v!r}" for k, v in kwargs(tile, spelling).items())
    return f"triton.Config({{{inner}}}, num_warps={tile.num_warps}, num_stages={tile.num_stages})"


def keys_seen(configs: list) -> list[str]:
    """The meta-parameter names a list of configs uses, sorted."""
    return sorted({k for c in configs for k in c.kwargs})
