"""The measurement database's tables (SCHEMA is the one definition) and its rows as problems.

Tables:
- meta(key, value): `app` = 'gnn-policy' and `schema` version; a file without them is not
  ours and is refused, never overwritten.
- gpus(name), problems(key + every GemmProblem field), configs(key + every TileConfig field,
  plus the row 'cublas' for torch.matmul).
- measurements: one row per (gpu, problem, config, source, versions), with the status, the
  per-call median and p10 / p90 times, TFLOP/s, the max relative error, the SM clock and
  the error text of a failure.
- retimes: later timings of stored pairs (`gnn-policy confirm`), one row per (gpu, problem,
  config, versions, run, round). Where a config has them, its figure is the median of all
  its timings.
"""
from __future__ import annotations

import dataclasses

from graphs import GemmProblem

APP, SCHEMA_VERSION = "gnn-policy", "1"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gpus (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS problems (
    id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL, m INTEGER, n INTEGER, k INTEGER,
    batch INTEGER, dtype TEXT, a_layout TEXT, b_layout TEXT, bias INTEGER, activation TEXT,
    residual INTEGER, model TEXT, layer TEXT);
CREATE TABLE IF NOT EXISTS configs (
    id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL, block_m INTEGER, block_n INTEGER,
    block_k INTEGER, split_k INTEGER, group_m INTEGER, num_warps INTEGER, num_stages INTEGER,
    variant TEXT);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    gpu_id INTEGER NOT NULL REFERENCES gpus(id),
    problem_id INTEGER NOT NULL REFERENCES problems(id),
    config_id INTEGER NOT NULL REFERENCES configs(id),
    source TEXT NOT NULL, versions TEXT NOT NULL, status TEXT NOT NULL,
    median_ms REAL, p10_ms REAL, p90_ms REAL, tflops REAL, max_rel_err REAL, sm_mhz INTEGER,
    error TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL DEFAULT (datetime('now')),
    UNIQUE (gpu_id, problem_id, config_id, source, versions));
CREATE TABLE IF NOT EXISTS retimes (
    id INTEGER PRIMARY KEY,
    gpu_id INTEGER NOT NULL REFERENCES gpus(id),
    problem_id INTEGER NOT NULL REFERENCES problems(id),
    config_id INTEGER NOT NULL REFERENCES configs(id),
    versions TEXT NOT NULL, run TEXT NOT NULL, round INTEGER NOT NULL, status TEXT NOT NULL,
    median_ms REAL, sm_mhz INTEGER,
    created_at TEXT NOT NULL DEFAULT (datetime('now')),
    UNIQUE (gpu_id, problem_id, config_id, versions, run, round));
"""


PROBLEM_COLUMNS = tuple(f.name for f in dataclasses.fields(GemmProblem))


def problem_from_fields(fields: dict) -> GemmProblem:
    """A GemmProblem from a problems-table row (SQLite stores its bools as 0 / 1)."""
    return GemmProblem(**dict(fields, bias=bool(fields["bias"]), residual=bool(fields["residual"])))
