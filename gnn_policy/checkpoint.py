"""Reading a policy checkpoint, and the one error every loader raises for a file that is not one.

A checkpoint is `{"model_config": dict, "state_dict": dict}` (an ensemble adds "members", a list
of further state dicts of the same model_config) written by `torch.save`, read with
`torch.load(weights_only=True)`, which refuses any pickle that would import or run code.
Whatever is wrong with a file (empty, truncated, random bytes, another torch file, code in
the pickle, weights of another shape), the caller gets a `CheckpointError` whose message
names the file and the fault on one line. torch's own messages are long and advise retrying
with `weights_only=False`, which is exactly what a doubtful file must not get.

This module imports torch only when a file is read, so the command line can name the error
type without paying for torch.
"""
from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

KEYS = ("model_config", "state_dict")


class CheckpointError(ValueError):
    """The file is not a usable policy checkpoint; the message names the file and the fault."""


def _load_fault(exc: Exception) -> str:
    """What torch.load's exception says about the file, in a few words."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "weights_only" in text.lower():
        # torch names what it refused, then how to allow it anyway: only the first part is said here
        wanted = re.search(r"unsupported (?:global: )?GLOBAL ([\w.]+)", text, re.IGNORECASE)
        opcode = re.search(r"Unsupported operand (\d+)", text)
        detail = (f" (it would import {wanted.group(1)})" if wanted else
                  f" (pickle opcode {opcode.group(1)})" if opcode else "")
        return f"its pickle asks for more than tensors and plain data{detail}; nothing in it was run"
    if isinstance(exc, EOFError) or "central directory" in text or isinstance(exc, zipfile.BadZipFile):
        return "truncated, or not a file that torch.save wrote"
    first = text.strip().splitlines()[0][:200] if text.strip() else ""
    return f"unreadable ({type(exc).__name__}{': ' + first if first else ''})"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's dict, checked to have the keys of one; FileNotFoundError when absent."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no policy checkpoint at {path}; train one with `gnn-policy pretrain`")
    if path.is_dir():
        raise CheckpointError(f"{path}: a folder, not a policy checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty, not a policy checkpoint")
    text = _text_start(path)
    if text is not None:  # torch's own complaint about it names a pickle opcode or a KeyError
        raise CheckpointError(f"{path}: a text file (it begins {text!r}), not one torch.save wrote: "
                              "not a policy checkpoint")
    import torch

    try:
        with warnings.catch_warnings():  # e.g. torch's note on an unusual pickle protocol: the error says it
            warnings.simplefilter("ignore")
            state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - every way a file fails to load is this one error
        raise CheckpointError(f"{path}: not a policy checkpoint: {_load_fault(exc)}") from None
    if not isinstance(state, dict) or not all(isinstance(state.get(k), dict) for k in KEYS):
        found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: a torch file but not a policy checkpoint: expected the keys "
                              f"{' and '.join(KEYS)}, found {found}")
    members = state.get("members", [])
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        raise CheckpointError(f"{path}: its members (an ensemble's other weights) are not a list of state dicts")
    if not _measured_ok(state.get("measured", {})):
        raise CheckpointError(f"{path}: its measured winners are not {{gpu: {{problem: [config, TFLOP/s]}}}}")
    return state


def _measured_ok(measured: Any) -> bool:
    def win(v: Any) -> bool:
        return (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                and isinstance(v[1], (int, float)) and v[1] > 0)
    return isinstance(measured, dict) and all(
        isinstance(gpu, str) and isinstance(wins, dict) and all(isinstance(k, str) and win(v) for k, v in wins.items())
        for gpu, wins in measured.items())


def _text_start(path: Path) -> str | None:
    """The first non-blank line of a file that reads as text (at most 40 characters), else None.
    A file torch.save wrote starts with a zip header or a pickle's protocol byte, neither text."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:  # unreadable: torch.load's attempt says so in the one error
        return None
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not a character cut off at the end of what was read
            return None
        text = head[:exc.start].decode("utf-8-sig")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:40] if lines and lines[0].replace("\t", " ").isprintable() else None


def weights_fault(exc: Exception) -> str:
    """`load_state_dict`'s complaint in a few words: how many weights are missing, extra or misshapen."""
    text = str(exc)
    counts = {what: len(re.findall(r'"[^"]+"', m.group(1))) if m else 0 for what, m in (
        ("missing", re.search(r"Missing key\(s\) in state_dict: (.*?)(?:\.\s*\n|\.\s*$)", text, re.S)),
        ("unexpected", re.search(r"Unexpected key\(s\) in state_dict: (.*?)(?:\.\s*\n|\.\s*$)", text, re.S)))}
    counts["of another shape"] = text.count("size mismatch for")
    parts = [f"{n} {what}" for what, n in counts.items() if n]
    return f"weights: {', '.join(parts)}" if parts else " ".join(text.split())[:200]


def model_fields(path: str | Path, state: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields a checkpoint's `model_config` holds, lists made tuples."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in state["model_config"].items()}
    fields.setdefault("geometry", False)  # saved before the cost head read the tile geometry
    names = fields.get("gpu_names", ())
    if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{path}: model_config.gpu_names is not a list of GPU names")
    return fields
