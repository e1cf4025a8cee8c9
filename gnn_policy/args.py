"""Command options as frozen dataclasses: each field's metadata carries its --help text.

A field's `check` is argparse's `type=`: it turns the flag's text into the value or refuses it,
so a bad value is argparse's one-line usage error (exit 2) before anything runs. Checks that
read several fields (a GEMM too large to address, a budget for too few problems) live in the
dataclass's `__post_init__` as a ValueError, which the command line reports the same way.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any, Callable


def flag(default: Any = dataclasses.MISSING, help: str = "", **extra: Any) -> Any:
    """A dataclass field that is also a command-line flag (no default: a required flag).

    A bool on by default becomes --no-<name>; `off="..."` is that flag's help text.
    `check=` (a callable of the flag's text) validates and converts it, e.g. `at_least(1)`.
    """
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def _number(text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def at_least(low: float, kind: type = int) -> Callable[[str], Any]:
    """A number >= low (int by default)."""
    def check(text: str) -> Any:
        value = _number(text, kind)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value

    check.__name__ = f"{kind.__name__} >= {low}"
    return check


def positive(text: str) -> float:
    """A finite number > 0 (seconds, a learning rate)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def one_of(*names: str) -> Callable[[str], str]:
    """One of `names`, in any letter case; returned as spelled in `names`."""
    by_lower = {n.lower(): n for n in names}

    def check(text: str) -> str:
        if text.lower() not in by_lower:
            shown = ", ".join(repr(n) for n in names if n)  # "" is the unset default, not a choice
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {shown}")
        return by_lower[text.lower()]

    check.__name__ = "choice"
    return check


def int_list(low: int) -> Callable[[str], str]:
    """Comma-separated integers >= low ("1,2,4"), kept as the text the field stores."""
    def check(text: str) -> str:
        items = [t.strip() for t in text.split(",")]
        for item in items:
            at_least(low)(item)
        return ",".join(items)

    check.__name__ = "list"
    return check


def parse_keys(text: str) -> list:
    """--keys' GEMMs, in order, each once: comma-separated keys, or @FILE with one a line (blank
    lines and # comments skipped). A key that names no GEMM raises ValueError naming it."""
    from graphs import GemmProblem

    if text.startswith("@"):
        path = Path(text[1:])
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read {path} ({exc.strerror or exc})") from None
        items = [line.split("#")[0].strip() for line in lines]
    else:
        items = [item.strip() for item in text.split(",")]
    keys = [k for k in dict.fromkeys(items) if k]
    if not keys:
        raise ValueError(f"no problem key in {text!r}")
    out = []
    for key in keys:
        try:
            out.append(GemmProblem.from_key(key))
        except ValueError as exc:  # a well-formed key can still name no GEMM (a dtype we do not have)
            raise ValueError(str(exc) if repr(key) in str(exc) else f"{key!r}: {exc}") from None
    return out


def problem_keys(text: str) -> str:
    """--keys' check: every key names a GEMM (kept as the text given)."""
    try:
        parse_keys(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_fields(parser: argparse.ArgumentParser, cls: type) -> None:
    """One --flag per field; bools become switches (--name, or --no-name when on by default)."""
    for f in dataclasses.fields(cls):
        name = f.name.replace("_", "-")
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        off_text = meta.pop("off", "")
        required = f.default is dataclasses.MISSING
        if f.type in (bool, "bool"):
            if f.default:
                parser.add_argument(f"--no-{name}", dest=f.name, action="store_false", default=None,
                                    help=off_text or f"turn off (on by default: {help_text})")
            else:
                parser.add_argument(f"--{name}", dest=f.name, action="store_true", default=None, help=help_text)
        elif meta.get("action") == "append":
            parser.add_argument(f"--{name}", dest=f.name, action="append", default=None,
                                help=f"{help_text} (default: {', '.join(f.default)})")
        else:
            kind = meta.get("check") or {"int": int, "float": float, "str": str}.get(str(f.type), type(f.default))
            shown = required or "(default:" in help_text or _placeholder(f.default, kind)
            parser.add_argument(f"--{name}", dest=f.name, type=kind, default=None, required=required,
                                help=help_text if shown else f"{help_text} (default: {f.default!r})")


def _placeholder(default: Any, kind: Callable[[str], Any]) -> bool:
    """Whether a default means "not given" rather than a value: the empty string, or a value the
    flag's own check refuses (--m 0 where --m must be at least 1). Its help says what happens then."""
    if default == "":
        return True
    try:
        kind(str(default))
    except (argparse.ArgumentTypeError, ValueError):
        return True
    return False


def build(cls: type, ns: dict[str, Any]) -> Any:
    """The dataclass from parsed flags; flags not given keep the field defaults.

    Values that did not pass through argparse (a --config file's) get the fields' checks here;
    a refused one raises ValueError naming its flag."""
    values = {k: v for k, v in ns.items() if v is not None}
    for f in dataclasses.fields(cls):
        if (f.metadata.get("action") == "append" or isinstance(f.default, tuple)) and f.name in values:
            values[f.name] = tuple(values[f.name])
        check = f.metadata.get("check")
        if check and f.name in values and isinstance(values[f.name], (int, float, str)):
            try:
                values[f.name] = check(str(values[f.name]))
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"--{f.name.replace('_', '-')}: {exc}") from None
    return cls(**values)
