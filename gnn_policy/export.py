"""`gnn-policy export`: tuned configs for vLLM / SGLang (JSON files) or Triton (a Python module).

The GEMMs are a model's (`--model`, as `tune --model` reads it) or weight shapes (`--shapes
NxK,...`, each an `nn.Linear` with N outputs and K inputs) at each of `--tokens`. Picks come
from the policy (its picks in order, those the target kernel can run; when none of its 64 best
can, its most probable configs among those the kernel can run) or, with `--measured DB`, from
real measurements (the fastest correct config of that problem on that GPU).

`--format vllm` writes one JSON file per weight shape into the `--out` folder, named and keyed
as vLLM and SGLang name and key theirs: the token count M (a string) -> `BLOCK_SIZE_M`,
`BLOCK_SIZE_N`, `BLOCK_SIZE_K`, `GROUP_SIZE_M`, `num_warps`, `num_stages`.
- MoE experts (a config.json with experts): `E={E},N={I},device_name={device}.json` for the
  fused gate/up GEMM, I being the expert intermediate size, and `..._down.json` for the down
  GEMM (SGLang reads both; vLLM reads the first for both GEMMs).
- Dense layers: `N={N},K={K},device_name={device}.json`, the engines' naming of their dense
  Triton GEMM files (which they ship for fp8 block-quantised weights only).
- The engines' kernels have no split-K and no TMA variant and run the product without our
  epilogue, so the pick is among configs without them, for the epilogue-free GEMM. 16-bit
  files carry no dtype in their name, as the engines' own (fp16 and bf16 read the same file).
- `device_name` is the CUDA device name with spaces as underscores (`NVIDIA_H200`): the local
  device's, else the spec's alias that reads like one.

`gnn-policy imported --root OUT` reads such a folder back (training/imported.py).

`--format triton` writes a module with `CONFIGS = {problem key: [triton.Config, ...]}`, the
`--top-k` best first, spelled as `--names` says (`project`: this template's names; `tutorial`:
tutorial 03's and vLLM's; `short`: BM-style); `read_triton` reads it back. `--out` is that
module's file: a folder there (one that exists, or a path ending in '/') is refused, not given
a module name of our own choosing.

A GEMM with no pick (with `--measured`, one the database has no correct measurement of on that
GPU) is skipped with its reason; an export that skips every GEMM is refused and writes nothing.
"""
from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from graphs import GemmProblem
from gnn_policy.args import at_least, flag
from gnn_policy.space import TileConfig

CANDIDATES = 64  # the policy's picks searched for ones the target kernel can run


@dataclasses.dataclass(frozen=True)
class ExportArgs:
    """Write tuned configs for a model or weight shapes: vLLM / SGLang JSON files or a Triton module."""

    out: str = flag(help="folder for --format vllm, .py file for --format triton")
    format: str = flag("vllm", "vllm (the JSON files vLLM and SGLang read) or triton (a module of triton.Config lists)")
    model: str = flag("", "a config.json, a shipped example (llama-3-8b, gpt2, mixtral-8x7b) or module:function")
    shapes: str = flag("", "weight shapes instead of --model: NxK,... (N outputs, K inputs, as nn.Linear)")
    tokens: str = flag("", "token counts (M), comma-separated; empty: 1,16,128,2048")
    tp: int = flag(1, "tensor-parallel degree of --model: export one GPU's share of its GEMMs, as vLLM splits "
                      "them (and names its MoE files)", check=at_least(1))
    measured: str = flag("", "pick from the real measurements in this database instead of the policy")
    gpu: str = flag("", "GPU spec name (default: the local device, or the H200 without one)")
    dtype: str = flag("bf16", "fp16 or bf16")
    top_k: int = flag(4, "configs per problem in a Triton module", check=at_least(1))
    names: str = flag("project", "meta-parameter names in a Triton module: project, tutorial or short")
    checkpoint: str = flag("", "policy checkpoint (default: checkpoints/pretrained.pt)")
    json: bool = flag(False, "print what was written as JSON")


class ExportError(ValueError):
    """Flags that cannot make an export."""


class NoPick(LookupError):
    """A problem the picks have nothing for; the message is the reason its row is skipped."""


def device_name(gpu: Any) -> str:
    """The engines' `device_name`: the CUDA device name with spaces as underscores."""
    import torch

    import hardware_specs

    if torch.cuda.is_available() and hardware_specs.detect().name == gpu.name:
        name = torch.cuda.get_device_name()
    else:
        name = next((a for a in gpu.aliases if a.split(" ")[0] in ("NVIDIA", "AMD") and " " in a), gpu.name)
    return name.replace(" ", "_")


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        shapes = [tuple(int(x) for x in s.lower().split("x")) for s in text.split(",") if s.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise ExportError(f"--shapes must be NxK pairs such as 4096x4096,1024x4096, got {text!r}")
    return shapes  # type: ignore[return-value]


def gemms(args: ExportArgs) -> tuple[list[tuple[int | None, str, GemmProblem]], list[dict], Any]:
    """([(tokens, layer, problem)], skipped, model spec or None) of the flags' model or shapes."""
    from gnn_policy.model_tune import DEFAULT_TOKENS, model_rows, parse_tokens

    if bool(args.model) == bool(args.shapes):
        raise ExportError("give --model or --shapes, one of them")
    if args.shapes:
        if args.tp != 1:
            raise ExportError("--tp splits the GEMMs of a --model config; --shapes are one GPU's shapes already")
        tokens = parse_tokens(args.tokens) if args.tokens else DEFAULT_TOKENS
        return [(t, f"{n}x{k}", GemmProblem(t, n, k, dtype=args.dtype, b_layout="col"))
                for t in tokens for n, k in _parse_shapes(args.shapes)], [], None
    model = model_rows(args.model, args.tokens, args.dtype, args.tp)
    return ([(r["tokens"], ", ".join(r["layers"]), r["problem"]) for r in model.rows],
            [{"what": w, "why": y} for w, y in model.skipped], model.config)


def picker(args: ExportArgs, gpu: Any) -> Callable[[GemmProblem, int, str], list[TileConfig]]:
    """pick(problem, k, spelling): up to k configs a kernel of that spelling can run, best
    first; NoPick when there is nothing to choose from (no measurement of the problem)."""
    from gnn_policy import config_names

    if args.measured:
        from gnn_policy.database import Database
        from gnn_policy.measure.result import CUBLAS

        # read as it is: an export never writes into the user's database (the shipped rows are
        # in it already when it is the one collect, finetune or stats keep)
        db = Database(args.measured, create=False)

        def measured(problem: GemmProblem, k: int, spelling: str) -> list[TileConfig]:
            figures = db.tflops(gpu.name, problem.key)
            ranked = sorted((c for c in figures if c != CUBLAS), key=lambda c: -figures[c])
            if not ranked:
                raise NoPick(f"{args.measured} has no correct measurement of a Triton config for "
                             f"{problem.key} on {gpu.name}")
            return [t for t in map(TileConfig.from_key, ranked) if config_names.expressible(t, spelling)][:k]
        return measured
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy

    policy = Policy.load(args.checkpoint or DEFAULT_CHECKPOINT)

    def predicted(problem: GemmProblem, k: int, spelling: str) -> list[TileConfig]:
        picks = [p.config for p in policy.top_k(problem, gpu, max(k, CANDIDATES))]
        picks = [c for c in picks if config_names.expressible(c, spelling)][:k]
        if len(picks) < k:  # the kernel lacks knobs the favourites use: its most probable configs follow
            space = policy.model.space
            valid = space.problem_mask(gpu, problem).flatten().nonzero().flatten().tolist()
            runnable = [c for c in (space.points[i] for i in valid)
                        if c not in picks and config_names.expressible(c, spelling)]
            picks += [c for c, p in policy.rank(problem, gpu, runnable) if p > 0][:k - len(picks)]
        return picks
    return predicted


def _picked(pick: Callable, problem: GemmProblem, k: int, spelling: str,
            kernel: str) -> tuple[list[TileConfig], str]:
    """(configs, '') or ([], why there are none): the reason a skipped row gives."""
    try:
        configs = pick(problem, k, spelling)
    except NoPick as exc:
        return [], str(exc)
    return configs, "" if configs else f"no config {kernel} can run"


def vllm_files(found: Iterable[tuple[int | None, str, GemmProblem]], spec: Any, device: str,
               pick: Callable) -> tuple[dict[str, dict[str, dict]], list[dict]]:
    """{file name: {M: entry}} and what was skipped, for the engines' plain GEMMs."""
    files: dict[str, dict[str, dict]] = {}
    skipped = []
    for tokens, layer, problem in found:
        plain = dataclasses.replace(problem, bias=False, activation=None, residual=False)
        if "experts." in layer and spec is not None:
            down = "down" in layer
            # vLLM's N is one GPU's expert intermediate size: Mixtral's 14336 is N=7168 at --tp 2
            name = (f"E={spec.experts},N={spec.expert_intermediate // spec.tp},device_name={device}"
                    + ("_down" if down else ""))
        elif problem.batch == 1 and problem.b_layout == "col" and tokens is not None:
            name = f"N={problem.n},K={problem.k},device_name={device}"
        else:
            skipped.append({"what": layer, "why": "not a token-count GEMM of nn.Linear weights: no engine file for it"})
            continue
        entries = files.setdefault(name + ".json", {})
        if str(tokens) in entries:  # layers differing only in their epilogue share the plain GEMM
            continue
        configs, why = _picked(pick, plain, 1, "tutorial", "the engines' kernels")
        if why:
            skipped.append({"what": f"{layer} at {tokens} tokens", "why": why})
            continue
        entries[str(tokens)] = configs[0].to_vllm()
    return {n: dict(sorted(f.items(), key=lambda kv: int(kv[0]))) for n, f in files.items() if f}, skipped


def triton_module(found: Iterable[tuple[int | None, str, GemmProblem]], gpu: str, source: str, names: str,
                  k: int, pick: Callable) -> tuple[str, dict[str, list[TileConfig]], list[dict]]:
    """(module text, {problem key: configs}, skipped) of a Triton export."""
    from gnn_policy import config_names

    table, layers, skipped = {}, {}, []
    for tokens, layer, problem in found:
        configs, why = _picked(pick, problem, k, names, f"a {names!r} kernel")
        if why:
            skipped.append({"what": f"{layer} at {tokens} tokens", "why": why})
            continue
        table.setdefault(problem.key, configs)
        layers.setdefault(problem.key, layer)
    lines = [f'"""Tuned Triton configs for {gpu}, best first, per GemmProblem key; written by '
             f'`gnn-policy export --format triton` from {source}."""', "import triton", "",
             f"GPU = {gpu!r}", f"NAMES = {names!r}", "CONFIGS = {"]
    for key, configs in table.items():
        lines.append(f"    {key!r}: [  # {layers[key]}")
        lines += [f"        {config_names.source(c, names)}," for c in configs]
        lines.append("    ],")
    lines.append("}")
    return "\n".join(lines) + "\n", table, skipped


def read_triton(path: str | Path) -> dict[str, list[TileConfig]]:
    """The {problem key: configs} of a module `export --format triton` wrote."""
    from gnn_policy import config_names

    # an explicit source loader: a module saved without the .py suffix is still Python
    source = importlib.machinery.SourceFileLoader(Path(path).stem, str(path))
    spec = importlib.util.spec_from_loader(source.name, source)
    module = importlib.util.module_from_spec(spec)
    try:
        source.exec_module(module)
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except OSError as e:  # a folder, or a file this process may not read
        raise ExportError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise ExportError(f"{path} is not a Python module: {getattr(e, 'msg', None) or e}{where}") from None
    if not isinstance(getattr(module, "CONFIGS", None), dict):
        raise ExportError(f"{path} has no CONFIGS dict: it was not written by export --format triton")
    return {key: [config_names.read(c) for c in configs] for key, configs in module.CONFIGS.items()}


def _out(args: ExportArgs) -> Path:
    """--out, checked before anything is picked or written: a folder for vllm, a file for triton."""
    out = Path(args.out)
    folder = out if args.format == "vllm" else out.parent
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker == out:
        raise ExportError(f"--out {args.out} is a file; --format vllm writes a folder of JSON files: name a folder")
    if blocker is not None:
        raise ExportError(f"--out {args.out}: {blocker} is a file, not a folder")
    if args.format == "triton" and (out.is_dir() or args.out.endswith("/")):  # Path drops the '/'
        raise ExportError(f"--out {args.out} is a folder; --format triton writes one Python module: name its "
                          f"file, such as {out / 'configs.py'}")
    return out


def _write(texts: dict[Path, str]) -> None:
    """Write every file or none: each goes to a temporary name first and is renamed once all are
    written; a folder or disk that refuses them is an ExportError naming the path, and what this
    call made (temporary files, new folders) is removed."""
    folders = {path.parent for path in texts}
    made = {folder for leaf in folders for folder in (leaf, *leaf.parents) if not folder.exists()}
    tmps = [path.with_name(path.name + ".tmp") for path in texts]
    try:
        for (path, text), tmp in zip(texts.items(), tmps):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
        for path, tmp in zip(texts, tmps):
            if path.is_dir():  # os.replace would fail half way through the set
                raise IsADirectoryError(21, "a folder is in the way", str(path))
    except OSError as exc:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        for folder in sorted(made, key=lambda d: -len(d.parts)):
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        raise ExportError(f"cannot write {exc.filename or next(iter(texts))}: {exc.strerror or exc}; "
                          "nothing was written") from None
    for path, tmp in zip(texts, tmps):
        os.replace(tmp, path)


def _nothing_exported(skipped: list[dict]) -> ExportError:
    if not skipped:
        return ExportError("nothing to export: no GEMM found; no file written")
    first, more = skipped[0], len(skipped) - 1
    return ExportError(f"nothing to export, no file written: {first['what']}: {first['why']}"
                       + (f" (and {more} more skipped)" if more else ""))


def run(args: ExportArgs) -> dict:
    """Write the export the flags ask for; ExportError (DatabaseError for --measured's file)
    before anything is written when it cannot."""
    from gnn_policy import config_names
    from gnn_policy.model_tune import gpu_of

    if args.format not in ("vllm", "triton"):
        raise ExportError(f"--format must be vllm or triton, got {args.format!r}")
    if args.dtype not in ("fp16", "bf16"):
        raise ExportError(f"--dtype must be fp16 or bf16 (the policy picks for 16-bit GEMMs, and the engines' "
                          f"files are 16-bit), got {args.dtype!r}")
    if args.format == "triton" and args.names not in config_names.SPELLINGS:
        raise ExportError(f"--names must be one of {sorted(config_names.SPELLINGS)}, got {args.names!r}")
    out = _out(args)
    gpu = gpu_of(args.gpu)
    found, skipped, spec = gemms(args)
    pick = picker(args, gpu)
    source = f"measurements in {args.measured}" if args.measured else f"the policy {args.checkpoint or 'pretrained.pt'}"
    if args.format == "vllm":
        files, more = vllm_files(found, spec, device_name(gpu), pick)
        if not files:
            raise _nothing_exported(more or skipped)
        _write({out / name: json.dumps(entries, indent=4) + "\n" for name, entries in files.items()})
        written = {name: sorted(int(m) for m in entries) for name, entries in files.items()}
    else:
        text, table, more = triton_module(found, gpu.name, source, args.names, args.top_k, pick)
        if not table:
            raise _nothing_exported(more or skipped)
        _write({out: text})
        written = {str(out): sorted(table)}
    return {"format": args.format, "gpu": gpu.name, "source": source, "out": str(out), "written": written,
            "skipped": skipped + more}
