"""GpuSpec: one GPU's datasheet numbers, loaded from the YAML files beside this module.

Every YAML holds the fields of `GpuSpec` plus a `sources` mapping that names, for each
numeric field, the datasheet, whitepaper or measurement the value came from. Loading is
strict: a missing field, an ill-typed value or a field without a source is an error that
names the file and the field, because a silently wrong spec becomes a silently wrong policy.

One field is optional: `launch_floor_us`, the least time one kernel takes under the project's
timing (CUDA-graph replays, `gnn_policy.measure.timing`), whatever its size. It is measured, not
in a datasheet, so only a GPU we ran has one; any other gets `DEFAULT_LAUNCH_FLOOR_US`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import warnings
from pathlib import Path
from typing import Any

import yaml

SPEC_DIR = Path(__file__).resolve().parent
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
FEATURES = ("tma", "wgmma", "fp8")
# The floor of a GPU whose YAML has none: the H200's measured one (h200_sxm_141gb.yaml). Launch
# and a minimal CTA's memory round trip are of the same order on recent GPUs, and a floor of 0
# leaves a tiny problem's roofline 10-1000x faster than any kernel: a GPU measured some day gets
# its own figure (`python -m gnn_policy.benchmarks.launch_floor`).
DEFAULT_LAUNCH_FLOOR_US = 2.5
DEFAULT_LAUNCH_FLOOR_SOURCE = "default: the H200's measured floor (h200_sxm_141gb.yaml), not measured on this GPU"


class SpecError(ValueError):
    """A spec file is malformed or a GPU name is unknown."""


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """Hardware numbers the config space and the policy read. Units are in the names."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    architecture: str
    compute_capability: str
    sm_count: int
    warp_size: int
    l2_bytes: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    registers_per_sm: int
    max_threads_per_sm: int
    memory_bytes: int
    memory_bandwidth_gbps: float
    sm_clock_mhz: int
    peak_tflops: dict[str, float]
    tensor_core_generation: int
    features: dict[str, bool]
    sources: dict[str, str]
    launch_floor_us: float = DEFAULT_LAUNCH_FLOOR_US  # see the module docstring
    slice_of: str | None = None  # set on SM slices: the full GPU this one is a part of

    def __hash__(self) -> int:
        return hash(self.name)

    def peak(self, dtype: str) -> float:
        """Dense peak TFLOP/s for a dtype name (fp32, tf32, fp16, bf16, fp8); 0 if unsupported."""
        return self.peak_tflops[dtype]

    def has(self, feature: str) -> bool:
        return self.features[feature]

    def as_dict(self) -> dict[str, Any]:
        """The spec with the YAML's field names, JSON-serialisable."""
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        return d


_SCALAR_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str, "vendor": str, "architecture": str, "compute_capability": str,
    "sm_count": int, "warp_size": int, "l2_bytes": int, "smem_per_sm_bytes": int,
    "smem_per_block_bytes": int, "registers_per_sm": int, "max_threads_per_sm": int,
    "memory_bytes": int, "memory_bandwidth_gbps": (int, float), "sm_clock_mhz": int,
    "tensor_core_generation": int,
}
_POSITIVE = ("sm_count", "warp_size", "l2_bytes", "smem_per_sm_bytes", "smem_per_block_bytes", "registers_per_sm",
             "max_threads_per_sm", "memory_bytes", "memory_bandwidth_gbps", "sm_clock_mhz")
# Fields that are facts of the silicon and need a citation in `sources`.
_CITED = tuple(k for k in _SCALAR_TYPES if k not in ("name", "vendor", "architecture")) + (
    "peak_tflops", "features")


def _fail(path: Path, field: str, why: str) -> SpecError:
    return SpecError(f"{path.name}: field '{field}' {why}")


def _typed(path: Path, raw: dict, field: str, kind: type | tuple[type, ...]) -> Any:
    if field not in raw:
        raise _fail(path, field, "is missing")
    value = raw[field]
    # bool is an int subclass in Python; a YAML `true` is never a valid count.
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise _fail(path, field, f"must be {names}, got {type(value).__name__} {value!r}")
    return value


def _mapping(path: Path, raw: dict, field: str, keys: tuple[str, ...], kind: type) -> dict:
    value = raw.get(field)
    if not isinstance(value, dict):
        raise _fail(path, field, "is missing or not a mapping")
    out = {}
    for key in keys:
        item = value.get(key)
        ok = isinstance(item, kind) if kind is bool else (
            isinstance(item, (int, float)) and not isinstance(item, bool))
        if not ok:
            raise _fail(path, f"{field}.{key}", f"must be {kind.__name__}, got {item!r}")
        if kind is float and not (math.isfinite(item) and item >= 0):  # 0: the GPU lacks the dtype
            raise _fail(path, f"{field}.{key}", f"must be a finite number >= 0, got {item!r}")
        out[key] = float(item) if kind is float else item
    extra = set(value) - set(keys)
    if extra:
        raise _fail(path, field, f"has unknown keys {sorted(extra)}")
    return out


def _launch_floor(path: Path, raw: dict, sources: dict[str, str]) -> float:
    """The YAML's `launch_floor_us` (positive, with a source), or the default, whose source then
    says so (written into `sources`)."""
    if "launch_floor_us" not in raw:
        sources["launch_floor_us"] = DEFAULT_LAUNCH_FLOOR_SOURCE
        return DEFAULT_LAUNCH_FLOOR_US
    value = _typed(path, raw, "launch_floor_us", (int, float))
    if not (math.isfinite(value) and value > 0):
        raise _fail(path, "launch_floor_us", f"must be positive, got {value}")
    if not str(sources.get("launch_floor_us", "")).strip():
        raise _fail(path, "sources.launch_floor_us", "is missing: every value needs its source")
    return float(value)


def parse(path: Path) -> GpuSpec:
    """Parse and validate one YAML spec file."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path.name}: not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path.name}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path.name}: expected a mapping at the top level")
    values: dict[str, Any] = {}
    for field, kind in _SCALAR_TYPES.items():
        values[field] = _typed(path, raw, field, kind)
    values["memory_bandwidth_gbps"] = float(values["memory_bandwidth_gbps"])
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise _fail(path, "aliases", "must be a list of strings")
    values["aliases"] = tuple(aliases)
    values["peak_tflops"] = _mapping(path, raw, "peak_tflops", DTYPES, float)
    values["features"] = _mapping(path, raw, "features", FEATURES, bool)
    sources = raw.get("sources")
    if not isinstance(sources, dict):
        raise _fail(path, "sources", "is missing or not a mapping")
    for field in _CITED:
        if not isinstance(sources.get(field), str) or not sources[field].strip():
            raise _fail(path, f"sources.{field}", "is missing: every value needs its source")
    values["sources"] = {k: str(v) for k, v in sources.items()}
    values["launch_floor_us"] = _launch_floor(path, raw, values["sources"])
    unknown = set(raw) - set(values)
    if unknown:
        raise SpecError(f"{path.name}: unknown fields {sorted(unknown)}")
    for field in _POSITIVE:  # NaN and infinity are not counts or rates either
        if not (math.isfinite(values[field]) and values[field] > 0):
            raise _fail(path, field, f"must be positive, got {values[field]}")
    if values["tensor_core_generation"] < 0:
        raise _fail(path, "tensor_core_generation", f"must be 0 (none) or more, got {values['tensor_core_generation']}")
    if values["smem_per_block_bytes"] > values["smem_per_sm_bytes"]:
        raise _fail(path, "smem_per_block_bytes", "exceeds smem_per_sm_bytes")
    return GpuSpec(**values)


def _normalise(name: str) -> str:
    """Case- and punctuation-insensitive key: 'NVIDIA H100 80GB HBM3' -> 'nvidiah10080gbhbm3'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    specs: dict[str, GpuSpec] = {}
    index: dict[str, str] = {}
    for path in sorted(SPEC_DIR.glob("*.yaml")):
        spec = parse(path)
        if spec.name in specs:
            raise SpecError(f"{path.name}: duplicate GPU name {spec.name!r}")
        specs[spec.name] = spec
        for alias in (spec.name, *spec.aliases):
            key = _normalise(alias)
            if key in index and index[key] != spec.name:
                raise SpecError(f"{path.name}: alias {alias!r} already names {index[key]}")
            index[key] = spec.name
    return specs, index


def available() -> list[str]:
    """Canonical names of every GPU with a spec file, sorted."""
    return sorted(_registry()[0])


_SLICE = re.compile(r"(.+?)[-_]sm(\d+)", re.IGNORECASE)


def slice_granularity(compute_capability: str) -> tuple[int, int]:
    """(minimum, multiple) SM count of a green-context slice, CUDA's guideline per architecture.

    Measured on the H200 (9.0): asking for 33, 66 or 100 SMs gave 40, 72 and 104."""
    major = int(compute_capability.split(".")[0])
    return {6: (1, 1), 7: (2, 2), 8: (4, 2)}.get(major, (8, 8))


def sm_slice(base: GpuSpec, sm_count: int) -> GpuSpec:
    """`base` restricted to `sm_count` SMs (a CUDA green context): same L2, memory, per-SM
    limits and launch floor (the H200's slices never ran a kernel under it); peak rates scale
    with the SM count. A count the driver would round
    (`slice_granularity`) is refused: its kernels would run on more SMs than the spec says."""
    if base.slice_of:
        base = load(base.slice_of)
    if not 1 <= sm_count <= base.sm_count:
        raise SpecError(f"{base.name} has {base.sm_count} SMs; a slice of {sm_count} is impossible")
    if sm_count == base.sm_count:
        return base
    least, multiple = slice_granularity(base.compute_capability)
    if sm_count < least or sm_count % multiple:
        raise SpecError(f"{base.name} (compute capability {base.compute_capability}) slices come in multiples of "
                        f"{multiple} SMs, at least {least}: a green context of {sm_count} would run on "
                        f"{max(least, -(-sm_count // multiple) * multiple)}")
    scale = sm_count / base.sm_count
    note = f"{base.name} restricted to {sm_count} of {base.sm_count} SMs by a CUDA green context"
    return dataclasses.replace(
        base, name=f"{base.name}-sm{sm_count}", aliases=(), sm_count=sm_count, slice_of=base.name,
        peak_tflops={k: round(v * scale, 1) for k, v in base.peak_tflops.items()},
        sources=dict(base.sources, sm_count=note,
                     peak_tflops=f"{base.sources['peak_tflops']}, scaled by {sm_count}/{base.sm_count}"))


def load(name: str) -> GpuSpec:
    """The spec for a GPU name or alias (case and punctuation are ignored).

    `<gpu>-smNN` (e.g. `h200-sm64`) is that GPU restricted to NN SMs (`sm_slice`).
    """
    specs, index = _registry()
    key = _normalise(name)
    sliced = _SLICE.fullmatch(name)
    if key not in index and sliced:
        return sm_slice(load(sliced.group(1)), int(sliced.group(2)))
    if key not in index:
        raise SpecError(f"unknown GPU {name!r}; known GPUs: {', '.join(available())}")
    return specs[index[key]]


def detect(device: int | None = None) -> GpuSpec:
    """The spec of the local CUDA device, cross-checked against what the driver reports."""
    import torch

    if not torch.cuda.is_available():
        raise SpecError("no CUDA device is visible; pass a GPU name instead (see `gnn-policy specs`)")
    index = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(index)
    spec = load(props.name)
    l2 = getattr(props, "L2_cache_size", None)
    checks = [("sm_count", spec.sm_count, props.multi_processor_count), ("l2_bytes", spec.l2_bytes, l2)]
    for field, ours, theirs in checks:
        if theirs is not None and ours != theirs:
            warnings.warn(f"{spec.name}: spec says {field}={ours} but the device reports {theirs}",
                          stacklevel=2)
    return spec


def resolve(name: str) -> GpuSpec:
    """The spec called `name`, or the local device's when `name` is empty."""
    return load(name) if name else detect()
