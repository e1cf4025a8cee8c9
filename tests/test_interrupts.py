"""Ctrl-C and `kill` during the commands that measure: one line, exit 130, nothing lost or stranded.

A collection is run as a user's shell runs it, in a subprocess with the fake runner slowed
down, and stopped mid-problem by Ctrl-C (SIGINT to the whole process group, as a terminal
sends it: the workers get it too), by `kill` (SIGTERM) or by `kill -9`. The same command then
resumes to exactly the rows of an uninterrupted run, and its shard holds every one of them.
confirm, bench, finetune and transfer are interrupted in this process, where it is cheaper.
"""
import gzip
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gnn_policy import cli
from gnn_policy.cli import main
from gnn_policy.measure.workers import WorkerPool
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import save_checkpoint
from gnn_policy.search import Measurer
from training import adaptation, transfer_picks

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), FAKE_RUNNER_PAUSE="0.03")
ROWS = ("SELECT g.name, p.key, c.key, m.status FROM measurements m JOIN gpus g ON g.id=m.gpu_id "
        "JOIN problems p ON p.id=m.problem_id JOIN configs c ON c.id=m.config_id")


def _collect(db, shards=None, runner="fake_runner:slow"):
    return ["collect", "--db", str(db), "--gpu", "h200", "--split", "test", "--problems", "3", "--configs", "6",
            "--runner", runner, *(["--shard-dir", str(shards)] if shards else [])]


def _rows(db) -> set:
    with sqlite3.connect(db) as conn:
        return set(conn.execute(ROWS))


def _shard_rows(folder: Path) -> list:
    return [(r["gpu"], r["problem"], r["config"], r["status"])
            for p in folder.glob("*.jsonl.gz") for r in map(json.loads, gzip.open(p, "rt"))]


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and lines[-1].startswith("gnn-policy"), err
    return lines[-1]


def _alive_in_session(sid: int) -> list[int]:
    """Processes of session `sid` that still run (zombies waiting for a reaper do not)."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    db = tmp_path_factory.mktemp("whole") / "m.sqlite"
    os.environ["FAKE_RUNNER_PAUSE"] = "0"
    try:
        assert main(_collect(db)) == 0
    finally:
        del os.environ["FAKE_RUNNER_PAUSE"]
    return _rows(db)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "kill", "kill-9"])
def test_a_stopped_collection_resumes_to_the_uninterrupted_rows(uninterrupted, tmp_path, monkeypatch, capsys, how):
    db, shards = tmp_path / "m.sqlite", tmp_path / "shards"
    # as a terminal's foreground job: a suite started in the background (`nohup ... &`) ignores
    # SIGINT, and an ignored signal stays ignored across exec, so the child would never see Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "gnn_policy.cli", *_collect(db, shards)], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # until the first problem is stored
        try:
            if _rows(db):
                break
        except sqlite3.Error:  # not created yet
            pass
        time.sleep(0.1)
    time.sleep(0.3)  # into the second problem
    assert proc.poll() is None, proc.communicate()[1]
    {"ctrl-c": lambda: os.killpg(proc.pid, signal.SIGINT), "kill": proc.terminate, "kill-9": proc.kill}[how]()
    _, err = proc.communicate(timeout=60)
    stored = _rows(db)
    assert 0 < len(stored) < len(uninterrupted) and stored <= uninterrupted
    if how == "kill-9":
        assert proc.returncode == -signal.SIGKILL and "Traceback" not in err
    else:
        line = _one_line(err)
        assert proc.returncode == 130 and f"interrupted: {len(stored)} rows stored in {db}" in line
        assert "not yet in a shard" in line and line.endswith("run the same command again to resume")
    for _ in range(50):  # the workers die with their parent, whatever killed it
        if not _alive_in_session(proc.pid):
            break
        time.sleep(0.1)
    assert not _alive_in_session(proc.pid)
    monkeypatch.setenv("FAKE_RUNNER_PAUSE", "0")
    assert main(_collect(db, shards)) == 0
    assert _rows(db) == uninterrupted
    rows = _shard_rows(shards)
    assert len(rows) == len(uninterrupted) and set(rows) == uninterrupted  # each row in the shard once


def _interrupt_at(monkeypatch, owner, name: str, call: int) -> None:
    """Make `owner.name` raise KeyboardInterrupt (what Ctrl-C does) on its `call`-th call."""
    real, calls = getattr(owner, name), []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stopping)


@pytest.fixture()
def measured(tmp_path):
    """A database of two test problems measured by the fake runner, and a tiny policy."""
    db = tmp_path / "m.sqlite"
    assert main(["collect", "--db", str(db), "--gpu", "h200", "--split", "test", "--problems", "2", "--configs", "6",
                 "--runner", "fake_runner:measure"]) == 0
    torch.manual_seed(0)
    ckpt = tmp_path / "p.pt"
    save_checkpoint(PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=("L40S",))), ckpt)
    return db, ckpt


def _retimes(db) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM retimes").fetchone()[0]


def test_confirm(measured, monkeypatch, capsys):
    db, _ = measured
    argv = ["confirm", "--db", str(db), "--gpu", "h200", "--runner", "fake_runner:measure", "--top", "2"]
    capsys.readouterr()
    _interrupt_at(monkeypatch, WorkerPool, "run", 2)
    assert main(argv) == 130
    line = _one_line(capsys.readouterr().err)
    assert f"interrupted: {_retimes(db)} re-timings stored in {db}" in line and "run the same command" in line
    monkeypatch.undo()
    assert main(argv) == 0 and _retimes(db) == 2 * 3 * 3  # both problems: 2 configs and cuBLAS, 3 rounds


def test_bench(measured, monkeypatch, capsys, tmp_path):
    db, ckpt = measured
    argv = ["bench", "--db", str(db), "--gpu", "h200", "--runner", "fake_runner:measure", "--checkpoint", str(ckpt),
            "--budgets", "1,2", "--out", str(tmp_path / "bench"), "--no-wandb"]
    capsys.readouterr()
    _interrupt_at(monkeypatch, Measurer, "many", 2)
    assert main(argv) == 130
    line = _one_line(capsys.readouterr().err)
    assert "measurements stored in" in line and "run the same command again to resume" in line
    monkeypatch.undo()
    assert main(argv) == 0 and (tmp_path / "bench" / "bench.csv").exists()


def test_finetune(measured, monkeypatch, capsys, tmp_path):
    _, ckpt = measured
    argv = ["finetune", "--gpu", "l40s", "--simulate", "--budget", "6", "--problems", "2", "--rounds", "2",
            "--steps", "1", "--no-guard", "--checkpoint", str(ckpt), "--db", str(tmp_path / "f.sqlite"),
            "--output", str(tmp_path / "out"), "--no-snapshot", "--no-wandb"]
    capsys.readouterr()
    _interrupt_at(monkeypatch, adaptation, "calibrate", 2)  # the default strategy's steps
    assert main(argv) == 130
    line = _one_line(capsys.readouterr().err)
    assert "measurements of this run stored in" in line and "spends only what is left" in line
    monkeypatch.undo()
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spent_measurements"] == 6  # the budget, spent once


def test_transfer(measured, monkeypatch, capsys, tmp_path):
    _, ckpt = measured
    argv = ["transfer", "--target", "h200", "--simulate", "--plain", str(ckpt), "--meta", str(ckpt),
            "--budgets", "0", "--problems", "2", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "--no-wandb"]
    capsys.readouterr()
    _interrupt_at(monkeypatch, transfer_picks, "method_picks", 2)
    assert main(argv) == 130
    line = _one_line(capsys.readouterr().err)
    assert "interrupted: 1 runs finished this call, kept in" in line and "run the same command" in line
    monkeypatch.undo()
    assert main(argv) == 0 and (tmp_path / "out" / "transfer.csv").exists()


def test_ctrl_c_before_a_command_starts_is_one_line_too(monkeypatch, capsys):
    _interrupt_at(monkeypatch, cli, "parse", 1)
    assert main(["specs"]) == 130
    assert _one_line(capsys.readouterr().err) == "gnn-policy: interrupted"


def test_a_worker_ignores_ctrl_c():
    """The measuring child's side, in isolation: started with SIGINT blocked, then ignoring it."""
    with WorkerPool("fake_runner:measure", gpu="H200-SXM-141GB", timeout_s=30) as pool:
        pool._start()
        os.kill(pool._proc.pid, signal.SIGINT)
        time.sleep(0.2)
        assert pool._proc.is_alive()
    assert pool._proc is None  # closed: the child was stopped by the pool, not by the signal
