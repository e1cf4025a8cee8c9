"""Snapshot shards: export a run's rows, load them elsewhere once, never overwrite a shard."""
import pytest

from graphs import GemmProblem
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.snapshot import export_shard, import_shard, load_shipped
from gnn_policy.space import TileConfig

P = GemmProblem(16, 4096, 4096, dtype="bf16", bias=True, activation="gelu", model="Qwen2-7B", layer="q_proj")
C = TileConfig(16, 64, 128, 4, variant="tma")


def _rows():
    return [(Measurement("H200-SXM-141GB", P.key, C.key, "ok", median_ms=0.01, p10_ms=0.009, p90_ms=0.011,
                         tflops=40.0, max_rel_err=1e-3, sm_mhz=1980, versions="v"), P, C),
            (Measurement("H200-SXM-141GB", P.key, "cublas", "ok", median_ms=0.012, tflops=35.0, versions="v"), P, None),
            (Measurement("H200-SXM-141GB", P.key, TileConfig(64, 64, 64).key, "timeout", error="slow"), P,
             TileConfig(64, 64, 64))]


def test_round_trip_through_a_shard(tmp_path):
    with Database(tmp_path / "a.sqlite") as a:
        before = a.high_water()
        a.add(_rows())
        assert export_shard(a, tmp_path / "shards" / "run1.jsonl.gz", before) == 3
        assert export_shard(a, tmp_path / "shards" / "empty.jsonl.gz", a.high_water()) == 0
        original = sorted(map(str, a.rows_after(0)))
    with Database(tmp_path / "b.sqlite") as b:
        assert load_shipped(b, tmp_path / "shards") == 3
        assert load_shipped(b, tmp_path / "shards") == 0  # loaded once
        assert sorted(map(str, b.rows_after(0))) == original
        assert b.best_known("H200-SXM-141GB", P.key) == (C.key, 40.0)


def test_shards_are_append_only(tmp_path):
    with Database(tmp_path / "a.sqlite") as a:
        a.add(_rows())
        export_shard(a, tmp_path / "s.jsonl.gz", (0, 0))
        with pytest.raises(FileExistsError, match="append-only"):
            export_shard(a, tmp_path / "s.jsonl.gz", (0, 0))
    with Database(tmp_path / "b.sqlite") as b:
        assert import_shard(b, tmp_path / "s.jsonl.gz") == 3


def test_stats_says_it_is_loading_the_snapshot_then_answers_from_the_database(tmp_path):
    import os
    import subprocess
    import sys

    from gnn_policy.snapshot import unloaded

    with Database(tmp_path / "a.sqlite") as a:
        a.add(_rows())
        export_shard(a, tmp_path / "shards" / "run1.jsonl.gz", (0, 0))
    with Database(tmp_path / "b.sqlite") as b:
        assert [p.name for p in unloaded(b, tmp_path / "shards")] == ["run1.jsonl.gz"]
    env = dict(os.environ, GNN_POLICY_SHARDS=str(tmp_path / "shards"))
    # stats creates no database of its own but the default one: this one exists, empty
    Database(tmp_path / "c.sqlite").close()
    cli = [sys.executable, "-m", "gnn_policy.cli", "stats", "--db", str(tmp_path / "c.sqlite")]
    first = subprocess.run(cli, capture_output=True, text=True, env=env)
    assert first.returncode == 0 and "loading 1 shards of the shipped snapshot" in first.stderr
    assert "loaded 3 rows" in first.stderr and "H200-SXM-141GB" in first.stdout
    again = subprocess.run(cli, capture_output=True, text=True, env=env)
    assert again.stderr == "" and again.stdout == first.stdout


def test_a_shard_keeps_six_significant_digits_of_each_float(tmp_path):
    import gzip
    import json

    m = Measurement("H200-SXM-141GB", P.key, C.key, "ok", median_ms=0.11028799787163734, p10_ms=0.10992480218410491,
                    p90_ms=0.11462879702448844, tflops=50.24423715125814, max_rel_err=0.00020921234567,
                    sm_mhz=1980, versions="v")
    with Database(tmp_path / "a.sqlite") as a:
        a.add([(m, P, C)])
        export_shard(a, tmp_path / "s" / "run.jsonl.gz", (0, 0))
    row = json.loads(gzip.open(tmp_path / "s" / "run.jsonl.gz", "rt").readline())
    assert (row["median_ms"], row["p10_ms"], row["p90_ms"], row["tflops"], row["max_rel_err"]) == (
        0.110288, 0.109925, 0.114629, 50.2442, 0.000209212)
    assert row["sm_mhz"] == 1980 and row["problem"] == P.key  # only floats are rounded
    with Database(tmp_path / "b.sqlite") as b:
        load_shipped(b, tmp_path / "s")
        assert b.best_known("H200-SXM-141GB", P.key) == (C.key, 50.2442)
