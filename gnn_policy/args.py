"""Command options as frozen dataclasses: each field's metadata carries its --help text."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def flag(default: Any = dataclasses.MISSING, help: str = "", **extra: Any) -> Any:
    """A dataclass field that is also a command-line flag (no default: a required flag).

    A bool on by default becomes --no-<name>; `off="..."` is that flag's help text.
    """
    return dataclasses.field(default=default, metadata={"help": help, **extra})


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
            kind = {"int": int, "float": float, "str": str}.get(str(f.type), type(f.default))
            parser.add_argument(f"--{name}", dest=f.name, type=kind, default=None, required=required,
                                help=help_text if required else f"{help_text} (default: {f.default!r})")


def build(cls: type, ns: dict[str, Any]) -> Any:
    """The dataclass from parsed flags; flags not given keep the field defaults."""
    values = {k: v for k, v in ns.items() if v is not None}
    for f in dataclasses.fields(cls):
        if (f.metadata.get("action") == "append" or isinstance(f.default, tuple)) and f.name in values:
            values[f.name] = tuple(values[f.name])
    return cls(**values)
