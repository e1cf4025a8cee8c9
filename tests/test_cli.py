"""The gnn-policy command line, run as users run it: in a subprocess."""
import json
import sqlite3
import subprocess
import sys

import pytest

from gnn_policy.cli import parse


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gnn_policy.cli", *args], capture_output=True, text=True)


def test_specs_table_lists_every_gpu():
    res = _cli("specs")
    assert res.returncode == 0, res.stderr
    for name in ("H200-SXM-141GB", "A100-SXM4-80GB", "MI300X", "RTX-3090"):
        assert name in res.stdout


def test_a_reader_that_closes_the_pipe_stops_the_command_quietly():
    """`gnn-policy specs | head -1`: the reader has gone, the rest is not written, no traceback."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write fails with EPIPE
    res = subprocess.run([sys.executable, "-m", "gnn_policy.cli", "specs"], stdout=write, stderr=subprocess.PIPE,
                         text=True)
    os.close(write)
    assert res.returncode == 141 and res.stderr == ""


def test_specs_json_uses_yaml_field_names():
    res = _cli("specs", "--json")
    specs = json.loads(res.stdout)
    h200 = next(s for s in specs if s["name"] == "H200-SXM-141GB")
    assert h200["sm_count"] == 132 and h200["l2_bytes"] == 62914560 and h200["features"]["tma"]


def test_specs_space_counts_valid_configs():
    res = _cli("specs", "--space", "--gpu", "h200")
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("H200-SXM-141GB  bf16"))
    # full, hopper (warpspec refused), hopper-all, hopper-tested (with subtile), seed, lists
    assert row.split()[2:] == ["61720", "90940", "126940", "120840", "96", "11", "19"]


def test_unknown_gpu_is_a_clear_error():
    res = _cli("specs", "--space", "--gpu", "h300")
    assert res.returncode == 2 and "unknown GPU 'h300'" in res.stderr and "H200-SXM-141GB" in res.stderr


def test_demo_checks_against_torch():
    res = _cli("demo")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(" ok") == 4 and "WRONG" not in res.stdout
    # the config shown is the one that ran: the policy's pick for a problem given none
    import hardware_specs
    from gnn_policy.demo import CPU_CASES
    from gnn_policy.ops import policy_config

    problem = CPU_CASES[0][0]
    assert f"{policy_config(problem, hardware_specs.load('h200')).key} (policy)" in res.stdout


def test_flags_come_from_the_dataclass():
    name, args = parse(["specs", "--json", "--gpu", "h100", "--gpu", "l4"])
    assert name == "specs" and args.json and args.gpu == ("h100", "l4")
    with pytest.raises(SystemExit):
        parse(["export"])  # --out is required


def test_stats_counts_a_database(tmp_path):
    from graphs import GemmProblem
    from gnn_policy.database import Database
    from gnn_policy.measure.result import Measurement
    from gnn_policy.space import TileConfig

    from graphs.random_gemms import problems

    p, c = GemmProblem(8, 8, 8), TileConfig(16, 16, 16)
    rand = problems("random-test", 1)[0]
    with Database(tmp_path / "m.sqlite") as db:
        db.add([(Measurement("H200-SXM-141GB", p.key, c.key, "ok", median_ms=1.0, tflops=1.0), p, c),
                (Measurement("H200-SXM-141GB", p.key, "cublas", "timeout"), p, None),
                (Measurement("H200-SXM-141GB", rand.key, c.key, "ok", median_ms=1.0, tflops=1.0), rand, c)])
    res = _cli("stats", "--db", str(tmp_path / "m.sqlite"), "--json")
    assert json.loads(res.stdout) == {
        "gpus": {"H200-SXM-141GB": {"real_ok": 2, "real_failed": 1, "problems": 2, "configs": 2}},
        "splits": {"H200-SXM-141GB": {"random-test": {"problems": 1, "real_ok": 1, "real_failed": 0},
                                      "other": {"problems": 1, "real_ok": 1, "real_failed": 1}}}}
    table = _cli("stats", "--db", str(tmp_path / "m.sqlite")).stdout
    assert "real/timeout: 1" in table and "random-test" in table
    foreign = tmp_path / "other.sqlite"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)")
    refused = _cli("stats", "--db", str(foreign))
    assert refused.returncode == 2 and "not a gnn-policy database" in refused.stderr


def test_imported_counts_demonstrations_per_gpu(tmp_path):
    res = _cli("imported")
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines()[2:6]}
    assert rows["MI300X"][:2] == ["8", "288"] and rows["L40S"][:2] == ["1", "38"]
    assert "895 files, 168 duplicates read once" in res.stdout and "NVIDIA_H20-3e: 15" in res.stdout
    report = json.loads(_cli("imported", "--json").stdout)
    assert report["demonstrations"]["H100-SXM5-80GB"] == 144 and report["exact"] + report["mapped"] == 578
    missing = _cli("imported", "--root", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no tuned-configs folder" in missing.stderr


def test_help_shows_a_default_once_and_only_a_real_one(capsys):
    """A default the help text already states, an empty string or a value the flag refuses (a
    placeholder for "not given") is not repeated as "(default: ...)"."""
    from gnn_policy.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: '')" not in text and "(default: 0)" not in text
    assert "--batch BATCH batch count (default: 1)" in text
    assert text.count("default: checkpoints/pretrained.pt") == 1
