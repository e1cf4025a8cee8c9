"""Bad and unlucky inputs, run as a new user runs them: every one ends in one clear line.

Each case goes through the real command line (`gnn_policy.cli.main` in this process; a
representative few, and the interrupts in test_interrupts.py, as subprocesses) and asserts the
exit code, no traceback, a last stderr line that names the culprit, and, for every file the
case hands over, that its bytes did not change.
"""
import dataclasses
import errno
import hashlib
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import gnn_policy
from gnn_policy import ops
from gnn_policy.cli import main
from gnn_policy.database import Database
from gnn_policy.model import ModelConfig, PolicyModel
from hardware_specs import spec as spec_mod

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
FAKE = "fake_runner:measure"


class Marker:
    """Unpickling this would run code: it opens (creates) the file it names."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _files(tmp: Path) -> types.SimpleNamespace:
    """One of each bad checkpoint, plus a good small one to cut down."""
    good = tmp / "good.pt"
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=("L40S",)))
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, good)
    f = types.SimpleNamespace(dir=tmp, good=good, ran=tmp / "code-ran")
    for name, data in (("truncated", good.read_bytes()[:4096]), ("empty", b""), ("random", os.urandom(5000)),
                       ("text", b"hello\n"), ("json", b'{"model_config": {}}\n'),
                       ("text_bom", "\ufeff\n\thello w\u00f6rld\n".encode() + "\u00e9".encode() * 200),
                       ("code", pickle.dumps(Marker(f.ran), protocol=2)), ("code4", pickle.dumps(Marker(f.ran)))):
        setattr(f, name, tmp / f"{name}.pt")
        getattr(f, name).write_bytes(data)
    f.code_zip, f.keys, f.listed, f.weights = (tmp / n for n in ("code_zip.pt", "keys.pt", "listed.pt", "weights.pt"))
    torch.save({"model_config": Marker(f.ran)}, f.code_zip)
    torch.save({"weights": {}}, f.keys)
    torch.save([1, 2, 3], f.listed)
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": {"w": torch.zeros(2)}}, f.weights)
    f.folder = tmp / "folder.pt"
    f.folder.mkdir()
    f.fit_bytes, f.fit_json = tmp / "fit.bin", tmp / "fit.json"
    f.fit_bytes.write_bytes(b"\xff\xfe\x00garbage")
    f.fit_json.write_text('{"gpus": ["L40S"], "coefficients": {"tile_half": -1}}')
    f.db = tmp / "m.sqlite"
    main(["collect", "--db", str(f.db), "--gpu", "h200", "--split", "test", "--problems", "1", "--configs", "2",
          "--runner", FAKE])
    f.foreign, f.junk_db = tmp / "foreign.sqlite", tmp / "junk.sqlite"
    import sqlite3

    sqlite3.connect(f.foreign).execute("CREATE TABLE t (x)")
    f.junk_db.write_bytes(f.db.read_bytes()[:3000])
    return f


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("bad"))


def _digest(path: Path) -> str:
    if path.is_dir():
        return "folder"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


def _run(argv: list, capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    """The message: stderr's last line (a progress bar or argparse's usage may precede it)."""
    assert "Traceback" not in err and "weights_only=False" not in err, err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and lines[-1].startswith("gnn-policy"), err
    return lines[-1]


def _check(files, argv, code, needles, capsys, touched=()):
    """Run argv (str.format'ed with the files); assert the exit code, the message, untouched files."""
    argv = [a.format(f=files) if isinstance(a, str) else a for a in argv]
    given = [Path(a) for a in argv if isinstance(a, str) and a.startswith(str(files.dir))] + list(touched)
    before = {p: _digest(p) for p in given if p.exists()}  # a path that is not there yet may be an output
    got, out, err = _run(argv, capsys)
    assert got == code, (argv, out, err)
    assert "Traceback" not in err, err
    if code:
        message = _one_line(err)
        for needle in needles:
            assert needle.format(f=files) in message, (needle, message)
    else:
        assert all(n.format(f=files) in out for n in needles), out
    assert {p: _digest(p) for p in before} == before  # nothing handed over was written
    assert not files.ran.exists()  # no pickle got to run its code
    return out


TUNE = ["tune", "--m", "16", "--n", "64", "--k", "64"]
CHECKPOINTS = {  # file attribute -> what the message says about it
    "truncated": "truncated", "empty": "is empty", "random": "not a policy checkpoint",
    "text": "a text file (it begins 'hello'), not one torch.save wrote",
    "text_bom": "a text file (it begins 'hello w\u00f6rld'), not one torch.save wrote",  # BOM, blank line, tab, a cut character
    "json": "a text file (it begins '{{\"model_config\": {{}}}}'), not one torch.save wrote",  # {{: format
    "code": "nothing in it was run", "code4": "nothing in it was run", "code_zip": "nothing in it was run",
    "keys": "expected the keys model_config and state_dict", "listed": "found list",
    "weights": "weights do not fit its model_config", "folder": "a folder"}


@pytest.mark.parametrize("kind", CHECKPOINTS)
def test_tune_names_a_bad_checkpoint_and_what_is_wrong(files, capsys, kind):
    _check(files, [*TUNE, "--checkpoint", f"{{f.{kind}}}"], 2, [f"{{f.{kind}}}", CHECKPOINTS[kind]], capsys)


@pytest.mark.parametrize("argv", [
    ["finetune", "--gpu", "h200", "--simulate", "--budget", "4", "--checkpoint", "{f.truncated}"],
    ["finetune", "--gpu", "h200", "--simulate", "--budget", "4", "--checkpoint", "{f.code_zip}"],
    ["finetune", "--gpu", "h200", "--simulate", "--budget", "4", "--checkpoint", "{f.keys}"],
    ["bench", "--gpu", "h200", "--runner", FAKE, "--checkpoint", "{f.random}"],
    ["bench", "--gpu", "h200", "--runner", FAKE, "--checkpoint", "{f.code}"],
    ["transfer", "--target", "h200", "--simulate", "--plain", "{f.empty}"],
    ["transfer", "--target", "h200", "--simulate", "--plain", "{f.good}", "--meta", "{f.weights}"],
], ids=["finetune-truncated", "finetune-code", "finetune-keys", "bench-random", "bench-code", "transfer-empty",
        "transfer-meta-weights"])
def test_every_loader_refuses_a_bad_checkpoint_before_it_writes(files, capsys, argv, tmp_path):
    extra = ["--db", tmp_path / "db.sqlite", "--output", tmp_path / "out", "--no-wandb"] if argv[0] == "finetune" \
        else ["--db", tmp_path / "db.sqlite", "--no-wandb"] if argv[0] == "bench" \
        else ["--work", tmp_path / "work", "--out", tmp_path / "out", "--no-wandb"]
    _check(files, [*argv, *extra], 2, [argv[-1]], capsys)
    assert not list(tmp_path.iterdir())  # no database, state, output or W&B run was started


@pytest.mark.parametrize("argv, needle", [
    (["--analytic", "{f.fit_bytes}"], "not a fitted analytic model"),
    (["--analytic", "{f.fit_json}"], "positive 'coefficients'"),
])
def test_finetune_names_a_bad_analytic_fit(files, capsys, argv, needle, tmp_path):
    _check(files, ["finetune", "--gpu", "h200", "--simulate", "--budget", "4", "--checkpoint", "{f.good}", *argv,
                   "--db", tmp_path / "db.sqlite", "--output", tmp_path / "out", "--no-wandb"],
           2, [argv[-1], needle], capsys)


@pytest.mark.parametrize("kind", ["truncated", "code_zip", "keys"])
def test_matmul_raises_checkpoint_error_for_a_bad_checkpoint(files, monkeypatch, kind):
    monkeypatch.setenv("GNN_POLICY_CHECKPOINT", str(getattr(files, kind)))
    ops._policy.cache_clear()
    ops.policy_config.cache_clear()
    a = torch.randn(16, 32, dtype=torch.float16)
    try:
        with pytest.raises(gnn_policy.CheckpointError, match=str(getattr(files, kind))) as err:
            gnn_policy.matmul(a, a.T.contiguous())
    finally:
        ops._policy.cache_clear()
        ops.policy_config.cache_clear()
    assert "\n" not in str(err.value) and CHECKPOINTS[kind] in str(err.value) and not files.ran.exists()


VALUES = [  # argv, the flag or value the message names
    ([*TUNE[:2], "0", *TUNE[3:]], "argument --m: must be at least 1, got 0"),
    (["tune", "--m", "16", "--n", "-3", "--k", "64"], "argument --n"),
    (["tune", "--m", "16", "--n", "64", "--k", "x"], "'x' is not an integer"),
    ([*TUNE, "--batch", "0"], "argument --batch"),
    ([*TUNE, "--dtype", "int8"], "'int8' is not one of 'fp16', 'bf16', 'fp32'"),
    ([*TUNE, "--activation", "tanh"], "'tanh' is not one of 'none', 'relu'"),
    ([*TUNE, "--b-layout", "colmajor"], "'colmajor' is not one of 'row', 'col'"),
    ([*TUNE, "--tp", "0"], "argument --tp: must be at least 1"),
    ([*TUNE, "--top-k", "0"], "argument --top-k"),
    (["tune", "--m", "16", "--n", "64", "--k", "1000000000000"], "more than the 2**31 the template addresses"),
    (["tune", "--m", "65536", "--n", "65536", "--k", "16"], "C spans 65536 x 65536"),
    ([*TUNE, "--batch", "70000"], "grid limit of 65535"),
    (["tune", "--m", "46341", "--n", "46340", "--k", "46340", "--dtype", "fp32", "--residual", "--gpu", "l4"],
     "more than the 24 GB of the L4"),
    ([*TUNE, "--gpu", "h300"], "unknown GPU 'h300'"),
    ([*TUNE, "--checkpoint", "{f.dir}/absent.pt"], "no policy checkpoint at"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--problems", "-1"], "argument --problems"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--configs", "0"], "argument --configs"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--timeout", "0"], "argument --timeout: must be more than 0"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--timeout", "nan"], "'nan' is not a finite number"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--time-limit", "-1"], "argument --time-limit"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--split", "nope"], "'nope' is not one of 'train', 'val', 'test', 'all'"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--runner", "garbage"], "'garbage' is not package.module:function"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--gpu", "h200", "--split", "test", "--problems", "1",
      "--runner", "nosuch:fn"], "could not start: ModuleNotFoundError: No module named 'nosuch'"),
    (["confirm", "--db", "{f.dir}/c.sqlite", "--top", "0"], "argument --top"),
    (["confirm", "--db", "{f.dir}/c.sqlite", "--rounds", "0"], "argument --rounds"),
    (["bench", "--budgets", "1,x"], "argument --budgets: 'x' is not an integer"),
    (["bench", "--budgets", "0,4"], "argument --budgets: must be at least 1"),
    (["finetune", "--gpu", "h200", "--budget", "lots"], "argument --budget: give a number of measurements"),
    (["finetune", "--gpu", "h200", "--budget", "0"], "nothing to spend"),
    (["finetune", "--gpu", "h200", "--simulate", "--budget", "99999999"], "at most 2048 measurements per tuning"),
    (["finetune", "--gpu", "h200", "--budget", "8", "--problems", "0"], "argument --problems"),
    (["finetune", "--gpu", "h200", "--budget", "8", "--lr", "-1"], "argument --lr"),
    (["transfer", "--target", "h200", "--budgets", "0,x"], "argument --budgets"),
    (["transfer", "--target", "h200", "--seeds", "a"], "argument --seeds"),
    (["transfer", "--target", "h200", "--budgets", "0,100000"], "at most 2048 per tuning problem"),
    (["pretrain", "--epochs", "0"], "argument --epochs"),
    (["pretrain", "--config", "{f.dir}/absent.json"], "--config {f.dir}/absent.json: No such file"),
    (["pretrain", "--config", "{f.random}"], "--config {f.random}: "),
    (["pretrain", "--config", "{f.fit_json}"], "unknown fields ['coefficients']"),
    (["meta-pretrain", "--real-weight", "0"], "argument --real-weight"),
]


@pytest.mark.parametrize("argv, needle", VALUES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in VALUES])
def test_a_bad_value_is_one_line_naming_it(files, capsys, argv, needle):
    _check(files, argv, 2, [needle], capsys)


@pytest.mark.parametrize("flags, key", [(["--dtype", "BF16"], "_bf16_"), (["--dtype", "Fp16"], "_fp16_"),
                                        (["--bias", "--activation", "GELU"], "_bgelu"),
                                        (["--activation", "none"], "_rr on")])
def test_choices_take_any_letter_case(files, capsys, flags, key):
    _check(files, [*TUNE, *flags], 0, [key], capsys)


def _broken_spec(tmp: Path, old: str, new: bytes) -> Path:
    folder = tmp / "specs"
    folder.mkdir()
    text = (spec_mod.SPEC_DIR / "h200_sxm_141gb.yaml").read_bytes()
    assert old.encode() in text
    (folder / "broken.yaml").write_bytes(text.replace(old.encode(), new))
    return folder / "broken.yaml"


@pytest.mark.parametrize("old, new, field", [
    ("memory_bandwidth_gbps: 4800", b"memory_bandwidth_gbps: .nan", "'memory_bandwidth_gbps' must be positive"),
    ("memory_bandwidth_gbps: 4800", b"memory_bandwidth_gbps: -4800", "'memory_bandwidth_gbps' must be positive"),
    ("memory_bandwidth_gbps: 4800", b"memory_bandwidth_gbps: 0", "'memory_bandwidth_gbps' must be positive"),
    ("sm_clock_mhz: 1980", b"sm_clock_mhz: 0", "'sm_clock_mhz' must be positive"),
    ("max_threads_per_sm: 2048", b"max_threads_per_sm: 0", "'max_threads_per_sm' must be positive"),
    ("registers_per_sm: 65536", b"registers_per_sm: -65536", "'registers_per_sm' must be positive"),
    ("bf16: 989.4,", b"bf16: .nan,", "'peak_tflops.bf16' must be a finite number"),
    ("sm_count: 132", b"sm_count: .inf", "'sm_count' must be int"),
    ("name: H200", b"name: H200\xff\xfe", "not UTF-8 text"),
])
def test_a_bad_spec_names_file_and_field(files, capsys, monkeypatch, tmp_path, old, new, field):
    path = _broken_spec(tmp_path, old, new)
    monkeypatch.setattr(spec_mod, "SPEC_DIR", path.parent)
    spec_mod._registry.cache_clear()
    try:
        _check(files, ["specs"], 2, ["broken.yaml", field], capsys, touched=[path])
    finally:
        spec_mod._registry.cache_clear()


def _deny_writes(monkeypatch, path: Path) -> None:
    """os.access says `path` is not writable (as chmod would, for anyone but root)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path and mode & os.W_OK
                        else real(p, mode, **kw))


def test_a_missing_database_is_named_and_nothing_is_created(files, capsys, tmp_path):
    _check(files, ["stats", "--db", tmp_path / "sub" / "m.sqlite"], 2, ["no database at"], capsys)
    assert not (tmp_path / "sub").exists()


@pytest.mark.parametrize("argv, code, needle", [
    (["stats", "--db", "{f.db}"], 0, "H200-SXM-141GB"),
    (["collect", "--db", "{f.db}", "--gpu", "h200", "--split", "test", "--problems", "1", "--runner", FAKE], 2,
     "cannot store measurements there: the file is read-only"),
])
def test_a_read_only_database_is_read_or_refused_for_the_right_reason(files, capsys, monkeypatch, argv, code, needle):
    _deny_writes(monkeypatch, files.db)
    _check(files, argv, code, [needle], capsys)


def test_a_database_in_a_read_only_folder_is_read(files, capsys, monkeypatch):
    _deny_writes(monkeypatch, files.dir)
    _check(files, ["stats", "--db", "{f.db}"], 0, ["H200-SXM-141GB"], capsys)


@pytest.mark.parametrize("db, needle", [("{f.random}", "not a readable SQLite database"),
                                        ("{f.foreign}", "not a gnn-policy database"),
                                        ("{f.junk_db}", "{f.junk_db}"), ("{f.folder}", "{f.folder}")])
def test_a_file_that_is_no_database_is_refused_untouched(files, capsys, db, needle):
    _check(files, ["stats", "--db", db], 2, [needle], capsys)


def _collect(db, shards, problems=2):
    return ["collect", "--db", db, "--gpu", "h200", "--split", "test", "--problems", str(problems), "--configs", "2",
            "--runner", FAKE, "--shard-dir", shards]


def _shard_rows(folder: Path) -> int:
    import gzip

    return sum(1 for p in folder.glob("*.jsonl.gz") for _ in gzip.open(p, "rt"))


@pytest.mark.parametrize("fault", ["not-a-folder", "disk-full"])
def test_a_failed_export_keeps_its_rows_for_the_next_run(files, capsys, monkeypatch, tmp_path, fault):
    db, shards = tmp_path / "m.sqlite", tmp_path / "shards"
    if fault == "not-a-folder":
        blocked = tmp_path / "a-file"
        blocked.write_text("")
        argv, needle = _collect(db, blocked / "shards"), "Not a directory"
    else:
        def full(*a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr("gnn_policy.snapshot.gzip.open", full)
        argv, needle = _collect(db, shards), "No space left on device"
    _check(files, argv, 2, [needle, "stay in", "the next run with --shard-dir exports them"], capsys)
    monkeypatch.undo()
    assert not shards.exists() or not list(shards.iterdir())  # no half shard left behind
    with Database(db) as d:
        stored = d.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    out = _check(files, _collect(db, shards, problems=3), 0, ["shard_rows"], capsys)
    with Database(db) as d:  # the re-run's shard holds the failed run's rows and its own
        assert _shard_rows(shards) == d.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] > stored
    assert '"skipped": ' in out


SUBPROCESS = [  # a representative few, as a user's shell runs them
    ([*TUNE[:2], "0", *TUNE[3:]], "argument --m"),
    ([*TUNE, "--dtype", "int8"], "'int8' is not one of"),
    (["tune", "--m", "16", "--n", "64", "--k", "1000000000000"], "2**31"),
    (["finetune", "--gpu", "h200", "--simulate", "--budget", "99999999"], "at most 2048"),
    (["collect", "--db", "{f.dir}/c.sqlite", "--split", "nope"], "'nope' is not one of"),
    (["stats", "--db", "{f.dir}/nowhere/m.sqlite"], "no database at"),
    ([*TUNE, "--checkpoint", "{f.truncated}"], "truncated"),
    ([*TUNE, "--checkpoint", "{f.code_zip}"], "nothing in it was run"),
]


@pytest.mark.parametrize("argv, needle", SUBPROCESS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in SUBPROCESS])
def test_in_a_subprocess_too(files, argv, needle):
    argv = [a.format(f=files) for a in argv]
    res = subprocess.run([sys.executable, "-m", "gnn_policy.cli", *argv], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert res.returncode == 2 and needle.format(f=files) in _one_line(res.stderr), res.stderr
    assert not files.ran.exists() and not (files.dir / "nowhere").exists()
