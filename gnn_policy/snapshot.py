"""The shipped measurement snapshot: append-only gzip'd JSON-lines shards, one per collection run.

A shard is written at the end of a `collect` or `confirm` run with the rows that run added
(measurements, and re-timings marked `"kind": "retime"`), and is loaded
into the SQLite database on first use (recorded in its meta table, so never twice). Shards
instead of one committed SQLite file, because re-committing a growing binary after every run
would bloat the git history. Rows a run could not export (it was killed, or the disk refused
the shard) stay pending in the database and go into the next run's shard (`RunExport`).
"""
from __future__ import annotations

import gzip
import json
import math
import os
import time
from pathlib import Path

from graphs import GemmProblem
from gnn_policy.atomic import replacing
from gnn_policy.database import Database
from gnn_policy.db_schema import problem_from_fields
from gnn_policy.measure.result import CUBLAS, Measurement, Retime
from gnn_policy.space import TileConfig

# $GNN_POLICY_SHARDS moves it (the tests point it at an empty folder).
SHIPPED = Path(os.environ.get("GNN_POLICY_SHARDS", Path(__file__).resolve().parent.parent / "data" / "measurements"))


PENDING = "export:pending"  # meta: row-id spans that runs with a shard folder stored but did not export


class ShardWriteError(RuntimeError):
    """A shard could not be written; its rows stay in the database, pending for the next export."""


def export_shard(db: Database, path: Path, since: tuple[int, int]) -> int:
    """Write the measurements and re-timings added after `since` (`db.high_water()` then) to a
    new shard; returns the number of rows written (0: no file)."""
    return _write(path, _rows(db, [[*since, None, None]]))


def _rows(db: Database, spans: list[list]) -> list[dict]:
    """The rows of row-id spans [measurement id, retime id, then up to (None: no end)], each once."""
    return ([r for lo, hi in _merged([(s[0], s[2]) for s in spans]) for r in db.rows_after(lo, hi)]
            + [dict(r, kind="retime") for lo, hi in _merged([(s[1], s[3]) for s in spans])
               for r in db.retimes_after(lo, hi)])


def _merged(spans: list[tuple]) -> list[tuple]:
    """(after, up to) id spans with the overlaps joined: a run's own span is also among the pending."""
    out: list[list] = []
    for lo, hi in sorted((lo, math.inf if hi is None else hi) for lo, hi in spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, None if hi == math.inf else hi) for lo, hi in out]


def _write(path: Path, rows: list[dict]) -> int:
    if not rows:
        return 0
    if path.exists():
        raise FileExistsError(f"{path}: shards are append-only; choose a new name")
    with replacing(path) as partial, gzip.open(partial, "wt") as f:  # a half shard could not load
        for row in rows:
            f.write(json.dumps(_compact(row), sort_keys=True) + "\n")
    return len(rows)


def _compact(row: dict) -> dict:
    """The row with its floats (times, TFLOP/s, errors) kept to 6 significant digits: timings vary
    by about 1% from replay to replay, and the 17 digits of a float's repr made a shard 1.7 times
    the size (a shard of 24,210 rows: 1.16 MB, 0.66 MB at 6 digits)."""
    return {k: float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v for k, v in row.items()}


def _pending(db: Database) -> list[list]:
    return json.loads(db.meta(PENDING) or "[]")


def end_open_spans(db: Database) -> None:
    """End the spans of runs that stopped before their export (killed, interrupted) at the rows
    stored now. Called before shards are loaded, whose rows must not be exported again."""
    spans = _pending(db)
    if any(s[2] is None for s in spans):
        end = db.high_water()
        db.set_meta(PENDING, json.dumps([s if s[2] is not None else [*s[:2], *end] for s in spans]))


class RunExport:
    """The rows a run stores, bound for a new shard when it ends (`write`).

    The run's span of row ids is recorded in the database before it measures, so a run that is
    killed, or whose export fails (a read-only folder, a full disk), leaves its rows pending
    rather than stranded: the next run with a shard folder writes them into its shard.
    """

    def __init__(self, db: Database, shard_dir: str | Path, gpu: str, kind: str = ""):
        self.db, self.shard_dir, self.gpu, self.kind = db, Path(shard_dir), gpu, kind
        self.since = db.high_water()
        db.set_meta(PENDING, json.dumps(_pending(db) + [[*self.since, None, None]]))

    def write(self, stamp: str | None = None) -> int:
        """Export this run's rows and every pending one; returns the rows written."""
        end = self.db.high_water()
        spans = [s if s[2] is not None else [*s[:2], *end] for s in _pending(self.db)] + [[*self.since, *end]]
        spans = [list(s) for s in dict.fromkeys(map(tuple, spans))]
        rows = _rows(self.db, spans)
        path = self.shard_dir / shard_name(self.gpu, self.kind, stamp)
        try:
            written = _write(path, rows)
        except OSError as exc:
            self.db.set_meta(PENDING, json.dumps(spans))
            raise ShardWriteError(f"could not write the shard {path} ({exc.strerror or exc}); its {len(rows)} rows "
                                  f"stay in {self.db.path}, and the next run with --shard-dir exports them") from None
        self.db.set_meta(PENDING, "[]")
        return written


def run_stamp() -> str:
    """UTC time of a run, as shard names and re-timing runs carry it."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def shard_name(gpu: str, kind: str, stamp: str | None = None) -> str:
    """`<gpu>_<kind>_<stamp>.jsonl.gz`, the name of one run's shard."""
    return f"{gpu}_{kind + '_' if kind else ''}{stamp or run_stamp()}.jsonl.gz"


def export_run(db: Database, shard_dir: str | Path, gpu: str, kind: str, since: tuple[int, int],
               stamp: str | None = None) -> int:
    """`export_shard` of one run of a command to `<shard_dir>/<gpu>_<kind>_<stamp>.jsonl.gz`."""
    return export_shard(db, Path(shard_dir) / shard_name(gpu, kind, stamp), since)


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


def unloaded(db: Database, folder: Path | None = None) -> list[Path]:
    """The shards in `folder` (default: the shipped snapshot) this database has not loaded."""
    return [p for p in sorted((folder or SHIPPED).glob("*.jsonl.gz")) if not db.meta(f"shard:{p.name}")]


def load_shipped(db: Database, folder: Path | None = None) -> int:
    """Load every shard in `folder` (default: the shipped snapshot) that this database has not seen yet."""
    end_open_spans(db)
    return sum(import_shard(db, p) for p in unloaded(db, folder))
