"""The SQLite measurement database: round trips, resume, atomic batches, refusing foreign files."""
import hashlib
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from graphs import GemmProblem
from gnn_policy.database import Database, DatabaseError
from gnn_policy.measure.result import CUBLAS, Measurement
from gnn_policy.space import TileConfig

P = GemmProblem(16, 4096, 4096, dtype="bf16", model="Llama-3-8B", layer="q_proj")
C1, C2 = TileConfig(16, 64, 128, 4), TileConfig(64, 64, 64)


def _ok(config, tflops, gpu="H200-SXM-141GB", problem=P, versions="torch 2.11 triton 3.6"):
    key = config.key if config else CUBLAS
    return Measurement(gpu, problem.key, key, "ok", median_ms=1.0, tflops=tflops, versions=versions), problem, config


def test_round_trip_best_known_and_stats(tmp_path):
    with Database(tmp_path / "m.sqlite") as db:
        assert db.add([_ok(C1, 40.0), _ok(C2, 30.0), _ok(None, 45.0),
                       (Measurement("H200-SXM-141GB", P.key, C2.key, "out_of_resources", error="smem"), P, C2)]) == 4
        assert db.best_known("H200-SXM-141GB", P.key) == (C1.key, 40.0)  # cuBLAS is not a config
        assert db.measured("H200-SXM-141GB") == {(P.key, C1.key), (P.key, C2.key), (P.key, CUBLAS)}
        stats = db.stats()["gpus"]["H200-SXM-141GB"]
        assert (stats["real_ok"], stats["real_failed"], stats["problems"], stats["configs"]) == (3, 1, 1, 3)
    # the problem's fields survive
    row = sqlite3.connect(tmp_path / "m.sqlite").execute("SELECT m, n, k, dtype, model FROM problems").fetchone()
    assert row == (16, 4096, 4096, "bf16", "Llama-3-8B")


def test_resume_keeps_the_first_row_and_versions_make_new_rows(tmp_path):
    with Database(tmp_path / "m.sqlite") as db:
        db.add([_ok(C1, 40.0)])
        assert db.add([_ok(C1, 99.0)]) == 0
        assert db.add([_ok(C1, 50.0, versions="torch 2.13 triton 3.7")]) == 1
        assert db.best_known("H200-SXM-141GB", P.key)[1] == 50.0


def test_simulated_rows_never_pass_as_real(tmp_path):
    with Database(tmp_path / "m.sqlite") as db:
        m = Measurement("H200-SXM-141GB", P.key, C1.key, "ok", source="simulated", median_ms=1.0, tflops=500.0)
        db.add([(m, P, C1)])
        assert db.best_known("H200-SXM-141GB", P.key) is None
        assert db.measured("H200-SXM-141GB") == set()
        stats = db.stats()
        assert (stats["gpus"]["H200-SXM-141GB"]["real_ok"], stats["gpus"]["H200-SXM-141GB"]["problems"]) == (0, 0)
        assert stats["by_source_status"]["H200-SXM-141GB"] == {"simulated/ok": 1}
        from gnn_policy.inventory import split_counts

        assert split_counts(db.problem_counts("H200-SXM-141GB")) == {}  # a problem only simulated is not counted


def test_a_batch_is_all_or_nothing(tmp_path):
    with Database(tmp_path / "m.sqlite") as db:
        bad = (Measurement("H200-SXM-141GB", "other", C2.key, "ok", median_ms=1.0, tflops=1.0), P, C2)
        with pytest.raises(ValueError, match="does not match"):
            db.add([_ok(C1, 40.0), bad])
        assert db.measured("H200-SXM-141GB") == set()


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_foreign_files_are_refused_and_left_untouched(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    before = _digest(junk)
    with pytest.raises(DatabaseError, match="not a readable SQLite database"):
        Database(junk)
    assert _digest(junk) == before
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE users (name TEXT)")
    con.commit()
    con.close()
    before = _digest(other)
    with pytest.raises(DatabaseError, match="not a gnn-policy database"):
        Database(other)
    assert _digest(other) == before
    with pytest.raises(DatabaseError, match="no database at"):
        Database(tmp_path / "missing.sqlite", create=False)


def test_kill_9_loses_at_most_the_batch_in_flight(tmp_path):
    path = tmp_path / "m.sqlite"
    writer = textwrap.dedent(f"""
        from graphs import GemmProblem
        from gnn_policy.database import Database
        from gnn_policy.measure.result import Measurement
        from gnn_policy.space import TileConfig
        db = Database({str(path)!r})
        configs = list(TileConfig(bm, bn, bk) for bm in (16, 32, 64, 128) for bn in (16, 32, 64, 128)
                       for bk in (16, 32, 64, 128))
        for m in range(1, 10**6):
            p = GemmProblem(m, 64, 64)
            db.add([(Measurement("H200-SXM-141GB", p.key, c.key, "ok", median_ms=1.0, tflops=1.0), p, c)
                    for c in configs])
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.5)
        if path.exists() and path.stat().st_size > 200_000:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with Database(path) as db:
        n = len(db.measured("H200-SXM-141GB"))
    assert n > 0 and n % 64 == 0
