"""`TileConfig`: one point of the config space, what the Triton template is compiled and launched with.

Its knobs, the variants of the template, and the arithmetic of its shared memory and registers.
`gnn_policy.space` (from which the rest of the project imports it) holds the rules that make a config invalid on a GPU
and the spaces themselves: the one definition every search, head and baseline reads.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

# ptr: pointer loads; tma: TMA loads, one program per tile; persistent: TMA loads, about one
# program per SM looping over tiles; warpspec: persistent with Triton's warp specialisation;
# subtile: persistent, C stored by TMA in two halves (half the staging room, so more stages fit);
# streamk: about one program per SM, each given an equal run of the (tile, K tile) iterations.
VARIANTS = ("ptr", "tma", "persistent", "warpspec", "subtile", "streamk")
TMA_VARIANTS = ("tma", "persistent", "warpspec", "subtile", "streamk")  # need the GPU's TMA and 16-byte aligned strides
PERSISTENT_VARIANTS = ("persistent", "warpspec", "subtile", "streamk")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


# The resource model (with `space.resident_programs`), written as arithmetic alone so that it serves
# one TileConfig's ints here and the cost model's tensors of every config at once
# (gnn_policy.cost_features): one definition.
def pipeline_smem(block_m: Any, block_n: Any, block_k: Any, stages: Any, elem_bytes: Any) -> Any:
    """Bytes of shared memory the software pipeline holds: one A and one B tile per stage."""
    return (block_m + block_n) * block_k * stages * elem_bytes


def accumulators_per_thread(block_m: Any, block_n: Any, warps: Any, warpspec: Any) -> Any:
    """fp32 accumulators per thread of the warps that hold the tile: a warp-specialised kernel's
    two consumer warp groups of `num_warps` each (its producer holds none)."""
    return block_m * block_n / (32 * warps * (1 + warpspec))


@dataclasses.dataclass(frozen=True, order=True)
class TileConfig:
    """One point of the space: what the Triton template is compiled and launched with."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "ptr"

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "split_k", "group_m", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TileConfig.{name} must be a positive int, got {value!r}")
        for name in ("block_m", "block_n", "block_k", "num_warps"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two, got {value}")
        if self.variant not in VARIANTS:
            raise ValueError(f"TileConfig.variant must be one of {VARIANTS}, got {self.variant!r}")

    @property
    def key(self) -> str:
        """Stable string key, e.g. 'bm128_bn128_bk64_sk1_gm8_w4_s3_ptr'."""
        return (f"bm{self.block_m}_bn{self.block_n}_bk{self.block_k}_sk{self.split_k}"
                f"_gm{self.group_m}_w{self.num_warps}_s{self.num_stages}_{self.variant}")

    @classmethod
    def from_key(cls, key: str) -> TileConfig:
        m = _KEY_RE.fullmatch(key)
        if not m:
            raise ValueError(f"not a TileConfig key: {key!r} (expected e.g. {_EXAMPLE_KEY!r})")
        *ints, variant = m.groups()
        config = cls(*(int(v) for v in ints), variant=variant)
        if config.key != key:
            raise ValueError(f"not a canonical TileConfig key: {key!r} (canonical: {config.key!r})")
        return config

    def to_triton(self) -> Any:
        """A `triton.Config` with the template's meta-parameter names."""
        import triton

        return triton.Config(
            {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
             "SPLIT_K": self.split_k, "GROUP_M": self.group_m, "USE_TMA": self.variant == "tma",
             "VARIANT": self.variant},
            num_warps=self.num_warps, num_stages=self.num_stages)

    @classmethod
    def from_triton(cls, config: Any) -> TileConfig:
        kw = config.kwargs
        return cls(block_m=kw["BLOCK_M"], block_n=kw["BLOCK_N"], block_k=kw["BLOCK_K"],
                   split_k=kw.get("SPLIT_K", 1), group_m=kw.get("GROUP_M", 8),
                   num_warps=config.num_warps, num_stages=config.num_stages,
                   variant=kw.get("VARIANT", "tma" if kw.get("USE_TMA") else "ptr"))

    def to_vllm(self) -> dict[str, Any]:
        """vLLM / SGLang tuned-config JSON keys (SGLang's `USE_TMA` marks the TMA variant)."""
        out: dict[str, Any] = {"BLOCK_SIZE_M": self.block_m, "BLOCK_SIZE_N": self.block_n,
                               "BLOCK_SIZE_K": self.block_k, "GROUP_SIZE_M": self.group_m,
                               "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.split_k != 1:
            out["SPLIT_K"] = self.split_k
        if self.variant in TMA_VARIANTS:
            out["USE_TMA"] = True
        if self.variant in PERSISTENT_VARIANTS:
            out["VARIANT"] = self.variant  # ours alone: vLLM and SGLang ignore unknown keys
        return out

    @classmethod
    def from_vllm(cls, entry: dict[str, Any]) -> TileConfig:
        """From a tuned-config entry; entries without warps or stages (some AMD files) are refused."""
        missing = [k for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps", "num_stages")
                   if k not in entry]
        if missing:
            raise ValueError(f"tuned-config entry lacks {missing}: {entry}")
        return cls(block_m=entry["BLOCK_SIZE_M"], block_n=entry["BLOCK_SIZE_N"],
                   block_k=entry["BLOCK_SIZE_K"], split_k=entry.get("SPLIT_K", 1),
                   group_m=entry.get("GROUP_SIZE_M", 1), num_warps=entry["num_warps"],
                   num_stages=entry["num_stages"],
                   variant=entry.get("VARIANT", "tma" if entry.get("USE_TMA") else "ptr"))

    def smem_bytes(self, dtype: str) -> int:
        """Shared memory the software pipeline holds (`pipeline_smem`)."""
        return pipeline_smem(self.block_m, self.block_n, self.block_k, self.num_stages, DTYPE_BYTES[dtype])

    def acc_per_thread(self) -> float:
        """fp32 accumulators per thread of the warps that hold the tile (`accumulators_per_thread`)."""
        return accumulators_per_thread(self.block_m, self.block_n, self.num_warps, self.variant == "warpspec")


_KEY_RE = re.compile(r"bm(\d+)_bn(\d+)_bk(\d+)_sk(\d+)_gm(\d+)_w(\d+)_s(\d+)_(" + "|".join(VARIANTS) + ")")
_EXAMPLE_KEY = "bm128_bn128_bk64_sk1_gm8_w4_s3_ptr"
