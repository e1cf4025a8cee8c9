"""Measuring on every GPU of a host (or of several hosts) under torchrun, with no process group.

`torchrun --nproc-per-node N -m gnn_policy.cli collect ...` (or confirm, sweep, bench) starts
N copies of the command with RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set. The
measuring worker is a pure (problem, config) -> Measurement function, so the copies need not
talk to each other. Each rank:
- sees only its own GPU: CUDA_VISIBLE_DEVICES is narrowed to its LOCAL_RANK before CUDA starts,
  so the measuring and compiling processes it spawns inherit it;
- takes the problems whose key hashes to its rank. A hash, not a position in a list, so that
  commands listing problems from their own database (confirm) agree on the shares, and a
  sweep's share handed on to confirm is confirm's share too;
- measures into its own database, `<stem>.rank<R><suffix>` beside --db, a copy of --db made on
  first use: what --db holds is skipped, and ranks never write one file;
- writes its own shard (`<gpu>_<kind>_rank<R>_<stamp>.jsonl.gz`), and the shards of all ranks
  load into one database: they hold disjoint problems;
- compiles on its share of the host's cores.
A rank that dies loses its problem in flight; torchrun then stops the other ranks (each loses
its problem in flight) unless `--max-restarts` has it start them again. Running the same
command again resumes every rank from its database.

Without torchrun (WORLD_SIZE unset or 1) every function here leaves its input as it is.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Launch:
    """This process's place in a torchrun launch; rank 0 of 1 without one."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1


def launch() -> Launch:
    """The torchrun environment of this process (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Launch()
    if "RANK" not in env:
        raise RuntimeError(f"WORLD_SIZE is {world} but RANK is not set: start the ranks with torchrun")
    rank = int(env["RANK"])
    return Launch(rank, world, int(env.get("LOCAL_RANK", rank)), int(env.get("LOCAL_WORLD_SIZE", world)))


def owner(key: str, world: int) -> int:
    """The rank that measures the problem with this key (stable across runs and machines)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % world


def share(items: Sequence[T], key: Callable[[T], str] = lambda p: p.key) -> list[T]:
    """The items this rank owns, in their order (all of them without torchrun)."""
    at = launch()
    return [x for x in items if owner(key(x), at.world) == at.rank]


def as_rank(db: str, shard_dir: str = "") -> str:
    """Set this process up as its rank (its GPU) and return the database it measures into:
    `db` itself without torchrun. Call it before anything starts CUDA."""
    at = launch()
    if at.world == 1:
        return db
    pin_device(at.local_rank)
    path = Path(db)
    mine = path.with_name(f"{path.stem}.rank{at.rank}{path.suffix}")
    if not mine.exists() and path.exists():
        _copy(path, mine)
    if not shard_dir:
        warnings.warn(f"rank {at.rank}: without --shard-dir its rows stay in {mine} alone; a shard per rank "
                      "is how the ranks' rows come together in one database", stacklevel=2)
    return str(mine)


@functools.cache
def pin_device(local_rank: int) -> None:
    """Narrow CUDA_VISIBLE_DEVICES to this rank's GPU (once), for this process and its children."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(local_rank + 1)]
    if local_rank >= len(ids):
        raise RuntimeError(f"LOCAL_RANK {local_rank}, but CUDA_VISIBLE_DEVICES={visible} names {len(ids)} GPUs")
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[local_rank]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # too late for the variable in this process
        torch.cuda.set_device(local_rank)


def _copy(src: Path, dst: Path) -> None:
    """Copy a gnn-policy database through SQLite's backup API; a kill mid-copy leaves no `dst`."""
    import sqlite3

    from gnn_policy.atomic import replacing
    from gnn_policy.database import Database

    with Database(src, create=False) as source, replacing(dst) as partial:
        target = sqlite3.connect(partial)
        try:
            source.conn.backup(target)
        finally:
            target.close()


def shard_kind(kind: str) -> str:
    """A shard's kind with the rank in it, so that ranks finishing in one second write two files."""
    at = launch()
    if at.world == 1:
        return kind
    return f"{kind}_rank{at.rank}" if kind else f"rank{at.rank}"


def part_path(path: Path) -> Path:
    """Where this rank writes its part of a report file: `bench.rank0of2.csv` for bench.csv."""
    at = launch()
    return path.with_name(f"{path.stem}.rank{at.rank}of{at.world}{path.suffix}")


def merge_parts(path: Path) -> int:
    """Concatenate the per-rank parts of a CSV file (a header each) into `path` and remove them;
    returns how many there were (0: none, `path` untouched). An incomplete set is refused."""
    pattern = re.compile(rf"{re.escape(path.stem)}\.rank(\d+)of(\d+){re.escape(path.suffix)}")
    found = {m.groups(): p for p in path.parent.glob(f"{path.stem}.rank*{path.suffix}")
             if (m := pattern.fullmatch(p.name))}
    if not found:
        return 0
    worlds = {int(w) for _, w in found}
    missing = [r for w in worlds for r in range(w) if (str(r), str(w)) not in found]
    if len(worlds) > 1 or missing:
        raise FileNotFoundError(f"{path.parent}: the per-rank parts of {path.name} are incomplete "
                                f"(ranks missing: {missing or 'none'}, world sizes: {sorted(worlds)}); "
                                "run the ranks that are missing again")
    parts = [found[(str(r), str(w))] for w in worlds for r in range(w)]
    texts = [p.read_text().splitlines(keepends=True) for p in parts]
    header = next((t[:1] for t in texts if t), [])  # a rank that owned no problem wrote an empty part
    path.write_text("".join(header + [line for t in texts for line in t[1:]]))
    for p in parts:
        p.unlink()
    return len(parts)
