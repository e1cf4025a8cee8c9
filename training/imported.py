"""vLLM's and SGLang's tuned Triton configs as `source=imported` demonstrations.

The files (data/tuned_configs, a verbatim copy of shared/data/tuned_configs, see its NOTICE.md)
hold each engine's winning config per M for one GPU, without timings: real labels from GPUs we
cannot run, used as imitation targets. They are DESIGN's `source=imported` data, kept out of the
measurement database (its correct rows carry timings, these have none), so they can never pass
as real measurements. Each file becomes `Demonstration`s, one per M key and GEMM, by these rules:

- Duplicates. A file whose name (whitespace removed: the engines write `block_shape=[128, 128]`
  or `[128,128]`) and configs (the M entries; the `triton_version` note aside) equal an earlier
  file's is read once. Same name with other configs (another engine, another Triton version)
  is a second demonstration and kept.
- Dtype. Our kernel and `GemmProblem` know fp16, bf16 and fp32 only, so fp8 / int8 / int4 files
  (`dtype=fp8_w8a8`, `int8_w8a16`, ..., and every dense `w8a8_block_fp8` file) are skipped and
  counted, not kept under a flag: their winners are picked for 1-byte operands and for the
  quantisation's block shape (BLOCK_K tied to the scale blocks), so as bf16 labels they would
  teach the wrong config, and a bf16 problem with a side flag is one a consumer can mistake
  for real. Files without a dtype (the engines' fp16/bf16 files, used for both) and
  `dtype=bf16` become bf16 problems: both are 2-byte types, under the same validity rules.
- GPU. `device_name` is looked up with `hardware_specs.load` (names and aliases, case and
  punctuation ignored); a GPU without a spec file is skipped and counted.
- Shape (fused MoE, the only 16-bit kind). `N` in the name is I, the intermediate size per
  tensor-parallel shard. The model is the one in graphs/data/model_gemm_shapes.json with E
  experts whose intermediate size is I times a power of two (the TP degree); none or several
  such models with different hidden sizes: skipped, nothing is guessed. Then up/gate:
  N = 2I, K = hidden; down: N = hidden, K = I. A file applies to both GEMMs unless a `_down`
  file beside it tunes the down GEMM (SGLang), which then gives the down GEMM only.
- Shape (dense 16-bit files: `N={N},K={K},device_name=...`, which `gnn-policy export` writes;
  the engines ship dense files only in 8-bit). Each M entry is the plain GEMM of an
  `nn.Linear` with N outputs and K inputs at M tokens: (M, N, K), A row-major, B column-major.
- Rows. Assumption: the M tokens' M·topk routed rows spread evenly over the E experts, so the
  fused launch is a batched GEMM of min(E, M·topk) active experts with ceil(M·topk / E) rows
  each; the padding of each expert's rows to BLOCK_SIZE_M depends on the config and is left
  out. A (token rows, K) activations are row-major; the weights are stored [E, N, K], so B is
  column-major. No epilogue: the fused kernel's SiLU-and-mul and routing weights are not ours.
- Config. Knobs our template lacks (AMD's waves_per_eu, matrix_instr_nonkdim, kpack; num_ctas)
  are ignored and counted. A value outside the space's values maps to the nearest one on a
  log2 scale, ties to the smaller (GROUP_SIZE_M 32 or 64 -> 16, num_warps 16 -> 8). If the
  config then breaks only the shared-memory rule, num_stages drops to the most stages that fit
  (our rule counts every stage's A and B tiles; several engine winners exceed it on L40S and
  MI300X). An entry without num_warps / num_stages, or breaking any other rule of
  `gnn_policy.space.violations` on its GPU and problem, is dropped. Counts are per
  demonstration: `exact` (the engine's config as it is), `mapped`, `dropped` with reasons.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from pathlib import Path

import hardware_specs
from graphs import GemmProblem
from graphs.suite import DATA as MODEL_SHAPES
from gnn_policy.args import flag
from gnn_policy.space import TMA_VARIANTS, ConfigSpace, TileConfig, space, tma_fits, violations

TUNED_CONFIGS = Path(__file__).resolve().parent.parent / "data" / "tuned_configs"
SIXTEEN_BIT = {None: "bf16", "bf16": "bf16", "fp16": "fp16"}  # name's dtype -> ours (None: fp16/bf16)
IGNORED_KNOBS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack", "num_ctas")
_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|[^,]*)")


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One engine's winning config for one GEMM on one GPU."""

    gpu: str  # canonical GpuSpec name
    problem: GemmProblem
    config: TileConfig
    origin: str  # file path relative to the tuned-configs folder
    m_key: int  # the file's M (tokens in the batch) that chose this config
    exact: bool  # False where `config` was mapped into the space (see the module docstring)


@dataclasses.dataclass
class ImportReport:
    """What the loader read, skipped, kept, mapped and dropped."""

    files: int = 0
    duplicates: int = 0
    skipped: dict[str, Counter] = dataclasses.field(
        default_factory=lambda: {"dtype": Counter(), "gpu": Counter(), "model": Counter()})
    files_used: Counter = dataclasses.field(default_factory=Counter)  # gpu -> files
    demonstrations: Counter = dataclasses.field(default_factory=Counter)  # gpu -> demonstrations
    exact: int = 0  # demonstrations whose config is the engine's as it is
    mapped: int = 0  # demonstrations whose config was mapped into the space
    mapped_why: Counter = dataclasses.field(default_factory=Counter)  # change -> demonstrations
    dropped: Counter = dataclasses.field(default_factory=Counter)  # reason -> demonstrations
    ignored_knobs: Counter = dataclasses.field(default_factory=Counter)  # knob -> M entries

    def as_dict(self) -> dict:
        """JSON-ready, largest counts first (`dataclasses.asdict` would rebuild a Counter from pairs)."""
        def plain(v):
            if isinstance(v, Counter):
                return dict(v.most_common())
            return {k: plain(x) for k, x in v.items()} if isinstance(v, dict) else v
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class ImportedArgs:
    """Count the demonstrations in vLLM's and SGLang's tuned configs, per GPU (source=imported)."""

    root: str = flag(str(TUNED_CONFIGS), "folder of tuned configs (vllm/..., sglang/...)")
    json: bool = flag(False, "print the loader's full report as JSON")


def name_fields(path: Path) -> dict[str, str | bool]:
    """Fields of a tuned-config file name, e.g. {'E': '8', 'N': '14336', 'device_name': ..., 'down': False}."""
    stem = path.name.removesuffix(".json")
    down = stem.endswith("_down")
    fields: dict[str, str | bool] = dict(_FIELD.findall(stem.removesuffix("_down")))
    fields["down"] = down
    return fields


def _entries(data: dict) -> dict[int, dict]:
    """The M -> config entries of a file (top-level notes such as `triton_version` left out)."""
    return {int(m): e for m, e in data.items() if isinstance(e, dict)}


def unique_files(root: Path) -> tuple[list[tuple[Path, dict[int, dict]]], int, int]:
    """(path, entries) of every distinct file under root, in path order; also files found and
    duplicates left out."""
    if not root.is_dir():
        raise FileNotFoundError(f"no tuned-configs folder at {root} (expected vllm/ and sglang/ "
                                f"with the engines' JSON files; the repo ships them in data/tuned_configs)")
    paths = sorted(root.rglob("*.json"))
    seen: set[tuple[str, str]] = set()
    out = []
    for path in paths:
        entries = _entries(json.loads(path.read_text()))
        key = (re.sub(r"\s", "", path.name), json.dumps(entries, sort_keys=True))
        if key not in seen:
            seen.add(key)
            out.append((path, entries))
    return out, len(paths), len(paths) - len(out)


def _models() -> list[dict]:
    models = json.loads(MODEL_SHAPES.read_text())["models"]
    return [dict(m, name=name) for name, m in models.items() if "experts" in m]


def moe_model(experts: int, inter: int, models: list[dict]) -> dict | None:
    """The one MoE model with `experts` experts whose intermediate size is `inter` x a TP degree."""
    fits = [m for m in models if m["experts"] == experts and m["inter"] % inter == 0
            and _power_of_two(m["inter"] // inter)]
    return fits[0] if len({(m["hidden"], m["topk"]) for m in fits}) == 1 else None


def _power_of_two(x: int) -> bool:
    return x & (x - 1) == 0


def moe_problems(model: dict, experts: int, inter: int, m_key: int, dtype: str,
                 gemms: tuple[str, ...]) -> list[GemmProblem]:
    """The fused-MoE GEMMs ('up' and/or 'down') of one file entry, as batched problems."""
    rows = m_key * model["topk"]
    tp = model["inter"] // inter
    shapes = {"up": (2 * inter, model["hidden"]), "down": (model["hidden"], inter)}
    return [GemmProblem(math.ceil(rows / experts), shapes[g][0], shapes[g][1], batch=min(experts, rows),
                        dtype=dtype, b_layout="col", model=model["name"], layer=f"fused_moe {g} TP{tp}")
            for g in gemms]


def _nearest(value: int, allowed: tuple[int, ...]) -> int:
    return min(allowed, key=lambda v: (abs(math.log2(v) - math.log2(value)), v))


def to_space(entry: dict, space_: ConfigSpace, gpu: hardware_specs.GpuSpec,
             problem: GemmProblem) -> tuple[TileConfig | None, list[str]]:
    """The entry as a valid config of the space, and why it differs (None, [why]: dropped)."""
    try:
        raw = TileConfig.from_vllm(entry)
    except ValueError:
        return None, ["missing " + "/".join(k for k in ("num_warps", "num_stages") if k not in entry)]
    values = {n: v for n, v in space_.values.items() if n != "variant"}
    if raw.variant not in space_.values["variant"]:
        return None, [f"variant {raw.variant} outside the space"]
    fixed = {n: _nearest(getattr(raw, n), v) for n, v in values.items()}
    why = [f"{n} {getattr(raw, n)}->{v}" for n, v in fixed.items() if v != getattr(raw, n)]
    config = dataclasses.replace(raw, **fixed)
    broken = {v.rule for v in violations(config, gpu, problem.dtype, problem.k)}
    if broken == {"smem"}:
        fits = [s for s in values["num_stages"] if s < config.num_stages and
                dataclasses.replace(config, num_stages=s).smem_bytes(problem.dtype) <= gpu.smem_per_block_bytes]
        if fits:
            why.append(f"num_stages {config.num_stages}->{max(fits)} (smem)")
            config = dataclasses.replace(config, num_stages=max(fits))
            broken = {v.rule for v in violations(config, gpu, problem.dtype, problem.k)}
    if config.variant in TMA_VARIANTS and not tma_fits(problem):
        broken.add("tma-alignment")
    if broken:
        return None, [f"breaks {'+'.join(sorted(broken))}"]
    return config, why


def _gemms(path: Path, fields: dict) -> tuple[str, ...]:
    if fields["down"]:
        return ("down",)
    return ("up",) if path.with_name(path.name.removesuffix(".json") + "_down.json").exists() else ("up", "down")


def _file_demos(path: Path, root: Path, entries: dict[int, dict], space_: ConfigSpace,
                models: list[dict], report: ImportReport) -> list[Demonstration]:
    """One file's demonstrations; a skipped file is counted under its first failing reason."""
    fields = name_fields(path)
    dtype = fields.get("dtype") or None
    if dtype not in SIXTEEN_BIT:
        report.skipped["dtype"][dtype] += 1
        return []
    try:
        gpu = hardware_specs.load(fields.get("device_name", ""))
    except hardware_specs.SpecError:
        report.skipped["gpu"][fields.get("device_name") or "(empty)"] += 1
        return []
    if "E" not in fields:
        if "N" in fields and "K" in fields:
            return _dense_demos(path, root, entries, fields, gpu, space_, report)
        report.skipped["model"]["neither a fused-MoE nor a dense file"] += 1
        return []
    experts, inter = int(fields["E"]), int(fields["N"])
    model = moe_model(experts, inter, models)
    if model is None:
        report.skipped["model"][f"E={experts} N={inter}"] += 1
        return []
    report.files_used[gpu.name] += 1
    problems = {m: moe_problems(model, experts, inter, m, SIXTEEN_BIT[dtype], _gemms(path, fields)) for m in entries}
    return _demos(path, root, entries, problems, gpu, space_, report)


def _dense_demos(path: Path, root: Path, entries: dict[int, dict], fields: dict, gpu: hardware_specs.GpuSpec,
                 space_: ConfigSpace, report: ImportReport) -> list[Demonstration]:
    n, k = int(fields["N"]), int(fields["K"])
    report.files_used[gpu.name] += 1
    dtype = SIXTEEN_BIT[fields.get("dtype") or None]
    problems = {m: [GemmProblem(m, n, k, dtype=dtype, b_layout="col", layer=f"dense N={n},K={k}")] for m in entries}
    return _demos(path, root, entries, problems, gpu, space_, report)


def _demos(path: Path, root: Path, entries: dict[int, dict], problems: dict[int, list[GemmProblem]],
           gpu: hardware_specs.GpuSpec, space_: ConfigSpace, report: ImportReport) -> list[Demonstration]:
    """Each entry's config mapped into the space, for each of its M's problems; counted in `report`."""
    out = []
    for m_key, entry in sorted(entries.items()):
        report.ignored_knobs.update(k for k in IGNORED_KNOBS if k in entry)
        for problem in problems[m_key]:
            config, why = to_space(entry, space_, gpu, problem)
            if config is None:
                report.dropped[why[0]] += 1
                continue
            report.exact += not why
            report.mapped += bool(why)
            report.mapped_why.update(why)
            report.demonstrations[gpu.name] += 1
            out.append(Demonstration(gpu.name, problem, config, str(path.relative_to(root)), m_key, not why))
    return out


def load_demonstrations(root: str | Path = TUNED_CONFIGS,
                        space_name: str = "full") -> tuple[list[Demonstration], ImportReport]:
    """Every demonstration under `root` mapped into the named space, and the loader's counts."""
    root = Path(root)
    files, found, duplicates = unique_files(root)
    report = ImportReport(files=found, duplicates=duplicates)
    models, space_ = _models(), space(space_name)
    demos = [d for path, entries in files for d in _file_demos(path, root, entries, space_, models, report)]
    return demos, report
