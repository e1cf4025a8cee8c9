"""The measurement database: SQLite (stdlib), WAL mode, one transaction per batch.

The tables and how a row becomes a GemmProblem: `gnn_policy.db_schema`. A file without the
`app` and `schema` meta rows is not ours and is refused, never overwritten. Where a config has
re-timings (`gnn-policy confirm`), its figure is the median of all its timings.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import statistics
from pathlib import Path
from typing import Iterable, Iterator

from graphs import GemmProblem
from gnn_policy.db_schema import APP, PROBLEM_COLUMNS, SCHEMA, SCHEMA_VERSION, problem_from_fields
from gnn_policy.measure.result import CUBLAS, Measurement, Retime
from gnn_policy.space import TileConfig

DEFAULT_PATH = Path(os.environ.get("GNN_POLICY_DB", "~/.cache/gnn-policy/measurements.sqlite")).expanduser()
_NO_END = 2**63 - 1  # SQLite's largest row id


class DatabaseError(RuntimeError):
    """The file is not a gnn-policy database, or is damaged."""


def read_only_reason(path: str | Path) -> str | None:
    """Why this process cannot write the database at `path` (None: it can). SQLite in WAL mode
    writes `-wal` and `-shm` files beside the database, so its folder must be writable too."""
    path = Path(path)
    if path.exists() and not os.access(path, os.W_OK):
        return "the file is read-only"
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if folder is not None and not os.access(folder, os.W_OK):
        return f"its folder {folder} is read-only"
    return None


class Database:
    """Measurements of many GPUs, problems and configs; safe to re-open and resume.

    `create=False` refuses a path with no database; `readonly=True` opens an existing one
    without writing anything (not even the schema), for reading alone."""

    def __init__(self, path: str | Path = DEFAULT_PATH, *, create: bool = True, readonly: bool = False):
        self.path = Path(path)
        existed = self.path.exists() and self.path.stat().st_size > 0
        if not existed and (readonly or not create):
            if self.path.is_file():  # "no database at" would be wrong about a file that is there
                raise DatabaseError(f"{self.path}: an empty file, not a gnn-policy database; it was left untouched")
            raise DatabaseError(f"no database at {self.path}")
        if readonly:
            self._open_readonly()
            return
        why = read_only_reason(self.path)
        if why:
            raise DatabaseError(f"{self.path}: cannot store measurements there: {why}; give a writable "
                                "database (it was left untouched)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(self.path)
        except sqlite3.DatabaseError as exc:  # e.g. a folder where the file should be
            raise DatabaseError(f"{self.path}: not a readable SQLite database ({exc}); it was left untouched") from None
        try:
            if existed:
                self._check_ours()
            self.conn.execute("PRAGMA journal_mode=WAL")
            with self.conn:
                self.conn.executescript(SCHEMA)
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('app', ?)", (APP,))
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise DatabaseError(f"{self.path}: not a readable SQLite database ({exc}); "
                                "it was left untouched") from None
        except DatabaseError:
            self.conn.close()
            raise

    def _open_readonly(self) -> None:
        # mode=ro still needs the WAL index beside the file; `immutable` reads a file nobody
        # may write (a read-only folder without it) with no locking at all
        uri = self.path.resolve().as_uri()
        for options in ("mode=ro", "immutable=1"):
            conn = None
            try:
                self.conn = conn = sqlite3.connect(f"{uri}?{options}", uri=True)
                self._check_ours()
                return
            except sqlite3.OperationalError:  # cannot read it this way: try the next
                pass
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise DatabaseError(f"{self.path}: not a readable SQLite database ({exc}); "
                                    "it was left untouched") from None
            except DatabaseError:
                conn.close()
                raise
            if conn is not None:
                conn.close()
        raise DatabaseError(f"{self.path}: the read-only database cannot be opened for reading")

    def _check_ours(self) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        app = None
        if "meta" in tables:
            row = self.conn.execute("SELECT value FROM meta WHERE key='app'").fetchone()
            app = row and row[0]
        if app != APP:
            raise DatabaseError(f"{self.path}: an SQLite file that is not a gnn-policy database "
                                f"(tables: {sorted(tables) or 'none'}); it was left untouched")
        if self.conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise DatabaseError(f"{self.path}: the database is damaged (PRAGMA quick_check failed)")

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One transaction; a write the disk refuses (full, gone read-only) is a DatabaseError
        that names the file, and the transaction is rolled back, whatever was stored before kept."""
        try:
            with self.conn:
                yield
        except sqlite3.OperationalError as exc:
            raise DatabaseError(f"{self.path}: could not store rows ({exc}); the rows stored "
                                "before are kept") from None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _id(self, table: str, key_col: str, key: str, values: dict | None = None) -> int:
        row = self.conn.execute(f"SELECT id FROM {table} WHERE {key_col}=?", (key,)).fetchone()
        if row:
            return row[0]
        cols = {key_col: key, **(values or {})}
        marks = ",".join("?" * len(cols))
        cur = self.conn.execute(f"INSERT INTO {table} ({','.join(cols)}) VALUES ({marks})", tuple(cols.values()))
        return cur.lastrowid

    def add_problem(self, problem: GemmProblem) -> int:
        return self._id("problems", "key", problem.key, dataclasses.asdict(problem))

    def add_config(self, config: TileConfig | None) -> int:
        if config is None:
            return self._id("configs", "key", CUBLAS)
        return self._id("configs", "key", config.key, dataclasses.asdict(config))

    def add(self, rows: Iterable[tuple[Measurement, GemmProblem, TileConfig | None]]) -> int:
        """Store a batch in one transaction (all or nothing); existing rows are kept. Returns rows added."""
        added = 0
        with self._writing():
            for m, problem, config in rows:
                if m.problem != problem.key or m.config != (config.key if config else CUBLAS):
                    raise ValueError(f"measurement {m.problem}/{m.config} does not match its problem/config")
                gpu_id = self._id("gpus", "name", m.gpu)
                pid, cid = self.add_problem(problem), self.add_config(config)
                cur = self.conn.execute(
                    "INSERT OR IGNORE INTO measurements (gpu_id, problem_id, config_id, source, versions,"
                    " status, median_ms, p10_ms, p90_ms, tflops, max_rel_err, sm_mhz, error)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (gpu_id, pid, cid, m.source, m.versions, m.status, m.median_ms, m.p10_ms,
                     m.p90_ms, m.tflops, m.max_rel_err, m.sm_mhz, m.error))
                added += cur.rowcount
        return added

    def add_retimes(self, rows: Iterable[tuple[Retime, GemmProblem, TileConfig | None]]) -> int:
        """Store re-timings in one transaction; returns rows added. A re-timing counts towards a
        config's figure only beside a first measurement under the same versions."""
        added = 0
        with self._writing():
            for r, problem, config in rows:
                if r.problem != problem.key or r.config != (config.key if config else CUBLAS):
                    raise ValueError(f"re-timing {r.problem}/{r.config} does not match its problem/config")
                ids = (self._id("gpus", "name", r.gpu), self.add_problem(problem), self.add_config(config))
                cur = self.conn.execute(
                    "INSERT OR IGNORE INTO retimes (gpu_id, problem_id, config_id, versions, run, round,"
                    " status, median_ms, sm_mhz) VALUES (?,?,?,?,?,?,?,?,?)",
                    (*ids, r.versions, r.run, r.round, r.status, r.median_ms, r.sm_mhz))
                added += cur.rowcount
        return added

    def high_water(self) -> tuple[int, int]:
        """The largest measurement and retime ids: what a later export starts after."""
        return tuple(self.conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {t}").fetchone()[0]
                     for t in ("measurements", "retimes"))

    def retimes_after(self, min_id: int, max_id: int | None = None) -> Iterator[dict]:
        """Re-timing rows with min_id < id (<= max_id, if given), with their gpu, problem and
        config keys and problem fields."""
        cols = ("gpu", "problem", "config", "versions", "run", "round", "status", "median_ms", "sm_mhz")
        q = ("SELECT g.name, p.key, c.key, r.versions, r.run, r.round, r.status, r.median_ms, r.sm_mhz, "
             + ", ".join(f"p.{c}" for c in PROBLEM_COLUMNS) +
             " FROM retimes r JOIN gpus g ON g.id=r.gpu_id JOIN problems p ON p.id=r.problem_id "
             "JOIN configs c ON c.id=r.config_id WHERE r.id > ? AND r.id <= ? ORDER BY r.id")
        for row in self.conn.execute(q, (min_id, _NO_END if max_id is None else max_id)):
            yield dict(zip(cols, row), problem_fields=dict(zip(PROBLEM_COLUMNS, row[len(cols):])))

    def problems(self, gpu: str) -> list[GemmProblem]:
        """The problems with at least one correct real measurement on `gpu`, in insertion order."""
        cols = PROBLEM_COLUMNS
        rows = self.conn.execute(
            f"SELECT {', '.join('p.' + c for c in cols)} FROM problems p WHERE p.id IN (SELECT m.problem_id "
            "FROM measurements m JOIN gpus g ON g.id=m.gpu_id WHERE g.name=? AND m.status='ok' "
            "AND m.source='real') ORDER BY p.id", (gpu,))
        return [problem_from_fields(dict(zip(cols, row))) for row in rows]

    def failed_configs(self, gpu: str, source: str = "real") -> dict[str, list[str]]:
        """Problem key -> the config keys that failed there (any status but ok; cuBLAS excluded)."""
        out: dict[str, list[str]] = {}
        rows = self.conn.execute(
            "SELECT p.key, c.key FROM measurements m JOIN gpus g ON g.id=m.gpu_id "
            "JOIN problems p ON p.id=m.problem_id JOIN configs c ON c.id=m.config_id "
            "WHERE g.name=? AND m.source=? AND m.status != 'ok' AND c.key != ?", (gpu, source, CUBLAS))
        for problem, config in rows:
            out.setdefault(problem, []).append(config)
        return out

    def count_since(self, gpu: str, source: str, after_id: int) -> int:
        """Measurement rows of `gpu` from `source` stored after row `after_id`."""
        return self.conn.execute(
            "SELECT COUNT(*) FROM measurements m JOIN gpus g ON g.id=m.gpu_id WHERE g.name=? AND m.source=? "
            "AND m.id > ?", (gpu, source, after_id)).fetchone()[0]

    def retimed(self, gpu: str) -> dict[str, set[str]]:
        """Problem key -> the configs (cuBLAS included) re-timed under the versions of their
        first measurement, whatever the re-timing's status: what `confirm` has tried."""
        rows = self.conn.execute(
            "SELECT DISTINCT p.key, c.key FROM retimes r JOIN gpus g ON g.id=r.gpu_id "
            "JOIN problems p ON p.id=r.problem_id JOIN configs c ON c.id=r.config_id "
            "JOIN measurements m ON m.gpu_id=r.gpu_id AND m.problem_id=r.problem_id "
            "AND m.config_id=r.config_id AND m.versions=r.versions "
            "WHERE g.name=? AND m.source='real'", (gpu,))
        out: dict[str, set[str]] = {}
        for problem, config in rows:
            out.setdefault(problem, set()).add(config)
        return out

    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._writing():
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def rows_after(self, min_id: int, max_id: int | None = None) -> Iterator[dict]:
        """Measurement rows with min_id < id (<= max_id, if given), joined with their gpu,
        problem and config keys."""
        cols = ("gpu", "problem", "config", "source", "versions", "status", "median_ms", "p10_ms",
                "p90_ms", "tflops", "max_rel_err", "sm_mhz", "error")
        pcols = PROBLEM_COLUMNS
        q = ("SELECT g.name, p.key, c.key, m.source, m.versions, m.status, m.median_ms, m.p10_ms, "
             "m.p90_ms, m.tflops, m.max_rel_err, m.sm_mhz, m.error, "
             + ", ".join(f"p.{c}" for c in pcols) +
             " FROM measurements m JOIN gpus g ON g.id=m.gpu_id JOIN problems p ON p.id=m.problem_id"
             " JOIN configs c ON c.id=m.config_id WHERE m.id > ? AND m.id <= ? ORDER BY m.id")
        for row in self.conn.execute(q, (min_id, _NO_END if max_id is None else max_id)):
            out = dict(zip(cols, row[:len(cols)]))
            out["problem_fields"] = dict(zip(pcols, row[len(cols):]))
            yield out

    def measured(self, gpu: str, source: str = "real", problem: str | None = None) -> set[tuple[str, str]]:
        """(problem key, config key) pairs already measured on `gpu` from `source` (of one
        problem, if given): what to skip."""
        q = ("SELECT p.key, c.key FROM measurements m JOIN gpus g ON g.id=m.gpu_id "
             "JOIN problems p ON p.id=m.problem_id JOIN configs c ON c.id=m.config_id "
             "WHERE g.name=? AND m.source=?")
        args: tuple = (gpu, source)
        if problem is not None:
            q, args = q + " AND p.key=?", args + (problem,)
        return set(self.conn.execute(q, args))

    def tflops(self, gpu: str, problem: str, source: str = "real") -> dict[str, float]:
        """TFLOP/s of every correct config of a problem from `source` (cuBLAS included).

        A config's figure is the median over its first timing and its re-timings under the
        same versions; across versions, the highest.
        """
        first = self.conn.execute(
            "SELECT c.key, m.versions, m.tflops, m.median_ms FROM measurements m JOIN gpus g ON g.id=m.gpu_id "
            "JOIN problems p ON p.id=m.problem_id JOIN configs c ON c.id=m.config_id "
            "WHERE g.name=? AND p.key=? AND m.status='ok' AND m.source=?", (gpu, problem, source))
        runs = {(key, ver): ([tf], tf * ms) for key, ver, tf, ms in first}  # tf * ms: the FLOPs, scaled
        again = self.conn.execute(
            "SELECT c.key, r.versions, r.median_ms FROM retimes r JOIN gpus g ON g.id=r.gpu_id "
            "JOIN problems p ON p.id=r.problem_id JOIN configs c ON c.id=r.config_id "
            "WHERE g.name=? AND p.key=? AND r.status='ok'", (gpu, problem))
        for key, ver, ms in again:
            if (key, ver) in runs:
                runs[(key, ver)][0].append(runs[(key, ver)][1] / ms)
        out: dict[str, float] = {}
        for (key, _), (figures, _) in runs.items():
            out[key] = max(out.get(key, 0.0), statistics.median(figures))
        return out

    def best_known(self, gpu: str, problem: str) -> tuple[str, float] | None:
        """The correct Triton config (cuBLAS excluded) with the highest TFLOP/s, re-timings included."""
        figures = {k: tf for k, tf in self.tflops(gpu, problem).items() if k != CUBLAS}
        if not figures:
            return None
        key = max(figures, key=figures.get)
        return key, figures[key]

    def problem_counts(self, gpu: str) -> list[tuple[GemmProblem, int, int]]:
        """(problem, correct real rows, failed real rows) for every problem with a real row on `gpu`."""
        cols = ", ".join(f"p.{c}" for c in PROBLEM_COLUMNS)
        rows = self.conn.execute(
            f"SELECT {cols}, SUM(m.source='real' AND m.status='ok'), SUM(m.source='real' AND m.status!='ok') "
            "FROM measurements m JOIN gpus g ON g.id=m.gpu_id JOIN problems p ON p.id=m.problem_id "
            "WHERE g.name=? GROUP BY p.id HAVING SUM(m.source='real') > 0 ORDER BY p.id", (gpu,))
        n = len(PROBLEM_COLUMNS)
        return [(problem_from_fields(dict(zip(PROBLEM_COLUMNS, r[:n]))), r[n], r[n + 1]) for r in rows]

    def stats(self) -> dict:
        """{'gpus': name -> {real_ok, real_failed, problems, configs}, 'by_source_status': name -> counts};
        problems and configs are those with real rows (simulated ones show under by_source_status)."""
        out: dict = {"gpus": {}, "by_source_status": {}}
        for (name,) in self.conn.execute("SELECT name FROM gpus ORDER BY name"):
            q = ("SELECT m.source, m.status, COUNT(*) FROM measurements m JOIN gpus g ON g.id=m.gpu_id "
                 "WHERE g.name=? GROUP BY m.source, m.status")
            by = {(src, st): n for src, st, n in self.conn.execute(q, (name,))}
            distinct = self.conn.execute(
                "SELECT COUNT(DISTINCT problem_id), COUNT(DISTINCT config_id) FROM measurements m "
                "JOIN gpus g ON g.id=m.gpu_id WHERE g.name=? AND m.source='real'", (name,)).fetchone()
            out["gpus"][name] = {
                "real_ok": by.get(("real", "ok"), 0),
                "real_failed": sum(n for (src, st), n in by.items() if src == "real" and st != "ok"),
                "problems": distinct[0], "configs": distinct[1]}
            out["by_source_status"][name] = {f"{src}/{st}": n for (src, st), n in sorted(by.items())}
        return out
