"""The shipped measurement snapshot: append-only gzip'd JSON-lines shards, one per collection run.

A shard is written at the end of a `collect` or `confirm` run with the rows that run added
(measurements, and re-timings marked `"kind": "retime"`), and is loaded
into the SQLite database on first use (recorded in its meta table, so never twice). Shards
instead of one committed SQLite file, because re-committing a growing binary after every run
would bloat the git history.
"""
from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

from graphs import GemmProblem
from gnn_policy.database import Database, problem_from_fields
from gnn_policy.measure.result import CUBLAS, Measurement, Retime
from gnn_policy.space import TileConfig

# $GNN_POLICY_SHARDS moves it (the tests point it at an empty folder).
SHIPPED = Path(os.environ.get("GNN_POLICY_SHARDS", Path(__file__).resolve().parent.parent / "data" / "measurements"))


def export_shard(db: Database, path: Path, since: tuple[int, int]) -> int:
    """Write the measurements and re-timings added after `since` (`db.high_water()` then) to a
    new shard; returns the number of rows written (0: no file)."""
    rows = list(db.rows_after(since[0])) + [dict(r, kind="retime") for r in db.retimes_after(since[1])]
    if not rows:
        return 0
    if path.exists():
        raise FileExistsError(f"{path}: shards are append-only; choose a new name")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # a kill mid-write must not leave a shard that cannot load
    with gzip.open(partial, "wt") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(partial, path)
    return len(rows)


def run_stamp() -> str:
    """UTC time of a run, as shard names and re-timing runs carry it."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def export_run(db: Database, shard_dir: str | Path, gpu: str, kind: str, since: tuple[int, int],
               stamp: str | None = None) -> int:
    """`export_shard` of one run of a command to `<shard_dir>/<gpu>_<kind>_<stamp>.jsonl.gz`."""
    name = f"{gpu}_{kind + '_' if kind else ''}{stamp or run_stamp()}.jsonl.gz"
    return export_shard(db, Path(shard_dir) / name, since)


def _problem_and_config(row: dict) -> tuple[GemmProblem, TileConfig | None]:
    problem = problem_from_fields(row["problem_fields"])
    if problem.key != row["problem"]:
        raise ValueError(f"shard row for {row['problem']} describes problem {problem.key}")
    return problem, None if row["config"] == CUBLAS else TileConfig.from_key(row["config"])


def _decode(row: dict) -> tuple[Measurement, GemmProblem, TileConfig | None]:
    problem, config = _problem_and_config(row)
    return Measurement(**{k: v for k, v in row.items() if k != "problem_fields"}), problem, config


def _decode_retime(row: dict) -> tuple[Retime, GemmProblem, TileConfig | None]:
    problem, config = _problem_and_config(row)
    return Retime(**{k: v for k, v in row.items() if k not in ("kind", "problem_fields")}), problem, config


def import_shard(db: Database, path: Path) -> int:
    """Load one shard unless it was loaded before; returns the rows added."""
    marker = f"shard:{path.name}"
    if db.meta(marker):
        return 0
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    added = db.add([_decode(r) for r in rows if r.get("kind") != "retime"])
    added += db.add_retimes([_decode_retime(r) for r in rows if r.get("kind") == "retime"])
    db.set_meta(marker, str(len(rows)))
    return added


def pending(db: Database, folder: Path | None = None) -> list[Path]:
    """The shards in `folder` (default: the shipped snapshot) that this database has not loaded."""
    return [p for p in sorted((folder or SHIPPED).glob("*.jsonl.gz")) if not db.meta(f"shard:{p.name}")]


def load_shipped(db: Database, folder: Path | None = None) -> int:
    """Load every shard in `folder` (default: the shipped snapshot) that this database has not seen yet."""
    return sum(import_shard(db, p) for p in pending(db, folder))
