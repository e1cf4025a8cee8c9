"""gnn-policy export: vLLM / SGLang JSON and Triton modules, read back unchanged by our importers."""
import dataclasses
import json

import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.args import build
from gnn_policy.cli import main
from gnn_policy.database import Database, DatabaseError
from gnn_policy.export import ExportArgs, ExportError, device_name, read_triton, run
from gnn_policy.measure.result import Measurement
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.space import TileConfig
from training.imported import load_demonstrations

H200 = hardware_specs.load("h200")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,)))
    path = tmp_path_factory.mktemp("ckpt") / "p.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return str(path)


def test_vllm_files_round_trip_through_the_importer(tmp_path, checkpoint):
    out = run(ExportArgs(out=str(tmp_path), model="mixtral-8x7b", tokens="1,64", gpu="h200", checkpoint=checkpoint))
    assert set(out["written"]) == {"N=4096,K=4096,device_name=NVIDIA_H200.json", "N=1024,K=4096,device_name=NVIDIA_H200.json",
                                   "N=8,K=4096,device_name=NVIDIA_H200.json", "N=32000,K=4096,device_name=NVIDIA_H200.json",
                                   "E=8,N=14336,device_name=NVIDIA_H200.json", "E=8,N=14336,device_name=NVIDIA_H200_down.json"}
    written = {(f.name, int(m), TileConfig.from_vllm(e)) for f in tmp_path.glob("*.json")
               for m, e in json.loads(f.read_text()).items()}
    assert all(c.split_k == 1 and c.variant == "ptr" for _, _, c in written)  # what the engines' kernels run
    demos, report = load_demonstrations(tmp_path)
    assert {(d.origin, d.m_key, d.config) for d in demos} == written and all(d.exact for d in demos)
    assert report.dropped == {} and report.demonstrations == {H200.name: len(written)}
    up = next(d.problem for d in demos if d.origin.startswith("E=8") and "down" not in d.origin and d.m_key == 64)
    assert (up.batch, up.m, up.n, up.k, up.b_layout) == (8, 16, 28672, 4096, "col")  # the model's expert GEMM
    dense = next(d.problem for d in demos if d.origin.startswith("N=1024") and d.m_key == 1)
    assert dense.key == GemmProblem(1, 1024, 4096, b_layout="col").key


@pytest.mark.parametrize("names", ["project", "tutorial"])
def test_triton_module_round_trip(tmp_path, checkpoint, names):
    path = tmp_path / "configs.py"
    out = run(ExportArgs(out=str(path), format="triton", shapes="256x128,64x32", tokens="16", top_k=3,
                         names=names, gpu="h200", checkpoint=checkpoint))
    configs = read_triton(path)
    assert sorted(configs) == out["written"][str(path)]
    assert set(configs) == {"1x16x256x128_bf16_rc", "1x16x64x32_bf16_rc"}
    assert all(len(v) == 3 and len(set(v)) == 3 for v in configs.values())
    if names == "tutorial":
        assert "BLOCK_SIZE_M" in path.read_text() and all(c.split_k == 1 for v in configs.values() for c in v)


def test_measured_picks_the_fastest_the_kernel_can_run(tmp_path):
    problem = GemmProblem(16, 256, 128, b_layout="col")
    split, plain, slow = TileConfig(16, 64, 32, 4), TileConfig(16, 64, 64), TileConfig(32, 32, 32)
    with Database(tmp_path / "m.sqlite") as db:
        db.add([(Measurement(H200.name, problem.key, c.key, "ok", median_ms=ms, tflops=problem.flops / ms / 1e9),
                 problem, c) for c, ms in ((split, 0.01), (plain, 0.02), (slow, 0.04))])
    common = dict(shapes="256x128", tokens="16,32", gpu="h200", measured=str(tmp_path / "m.sqlite"))
    out = run(ExportArgs(out=str(tmp_path / "v"), **common))
    entries = json.loads((tmp_path / "v" / "N=256,K=128,device_name=NVIDIA_H200.json").read_text())
    assert entries == {"16": plain.to_vllm()}  # split-K is the fastest, but the engines cannot run it
    assert out["written"] == {"N=256,K=128,device_name=NVIDIA_H200.json": [16]}
    run(ExportArgs(out=str(tmp_path / "t.py"), format="triton", top_k=8, **common))
    assert read_triton(tmp_path / "t.py") == {problem.key: [split, plain, slow]}
    (tmp_path / "t.py").rename(tmp_path / "configs")  # saved without its suffix, it still reads
    assert read_triton(tmp_path / "configs") == {problem.key: [split, plain, slow]}


@pytest.mark.parametrize("text, message", [(None, "no such file"), ("x = (", r"not a Python module: .* \(line 1\)"),
                                           ("CONFIGS = 3\n", "has no CONFIGS dict"),
                                           ("x = 1\0\n", "not a Python module: .*null bytes$"),
                                           ("folder", "cannot be read")])
def test_reading_back_what_export_did_not_write_names_the_file(tmp_path, text, message):
    path = tmp_path / "other.py"
    if text == "folder":
        path.mkdir()
    elif text is not None:
        path.write_text(text)
    with pytest.raises(ExportError, match=message):
        read_triton(path)


def test_a_tensor_parallel_export_names_one_gpus_share_as_vllm_does(tmp_path, checkpoint):
    out = run(ExportArgs(out=str(tmp_path), model="mixtral-8x7b", tokens="64", tp=2, gpu="h200", checkpoint=checkpoint))
    assert {"E=8,N=7168,device_name=NVIDIA_H200.json", "N=2048,K=4096,device_name=NVIDIA_H200.json",
            "N=4096,K=2048,device_name=NVIDIA_H200.json"} <= set(out["written"])
    demos, _ = load_demonstrations(tmp_path)  # the importer reads the share back as the GEMM one GPU runs
    up = next(d.problem for d in demos if d.origin.startswith("E=8") and "down" not in d.origin)
    assert (up.batch, up.m, up.n, up.k) == (8, 16, 14336, 4096)
    with pytest.raises(ExportError, match="--shapes are one GPU's shapes already"):
        run(ExportArgs(out=str(tmp_path), shapes="8x8", tp=2))


def test_flags_that_cannot_export(tmp_path):
    with pytest.raises(ExportError, match="--model or --shapes"):
        run(ExportArgs(out=str(tmp_path), model="gpt2", shapes="8x8"))
    with pytest.raises(ExportError, match="NxK pairs"):
        run(ExportArgs(out=str(tmp_path), shapes="8x8x8"))
    with pytest.raises(ExportError, match="fp16 or bf16"):
        run(ExportArgs(out=str(tmp_path), shapes="8x8", dtype="fp32"))


def test_device_names_as_the_engines_write_them():
    if torch.cuda.is_available():
        pytest.skip("the local device's name wins on a GPU machine")
    assert device_name(H200) == "NVIDIA_H200"
    assert device_name(hardware_specs.load("h100")) == "NVIDIA_H100_80GB_HBM3"
    assert device_name(hardware_specs.load("mi300x")) == "AMD_Instinct_MI300X"


def _measured_db(path, problem):
    """A database with two correct H200 measurements of `problem`."""
    with Database(path) as db:
        db.add([(Measurement(H200.name, problem.key, c.key, "ok", median_ms=ms, tflops=problem.flops / ms / 1e9),
                 problem, c) for c, ms in ((TileConfig(16, 64, 64), 0.02), (TileConfig(32, 32, 32), 0.04))])
    return str(path)


def test_a_skipped_row_names_the_problem_the_database_has_not_measured(tmp_path):
    db = _measured_db(tmp_path / "m.sqlite", GemmProblem(16, 256, 128, b_layout="col"))
    out = run(ExportArgs(out=str(tmp_path / "v"), shapes="256x128", tokens="16,32", gpu="h200", measured=db))
    assert out["written"] == {"N=256,K=128,device_name=NVIDIA_H200.json": [16]}
    assert out["skipped"] == [{"what": "256x128 at 32 tokens", "why": f"{db} has no correct measurement of a Triton "
                               f"config for 1x32x256x128_bf16_rc on {H200.name}"}]


@pytest.mark.parametrize("fmt, out", [("vllm", "v"), ("triton", "t.py")])
def test_an_export_with_nothing_to_write_fails_and_writes_nothing(tmp_path, fmt, out):
    # B row-major: what a fresh database holds for the H200, not the column-major B of nn.Linear
    db = _measured_db(tmp_path / "m.sqlite", GemmProblem(16, 256, 128))
    with pytest.raises(ExportError, match="nothing to export, no file written: 256x128 at 16 tokens: .* no correct "
                                          r"measurement .* 1x16x256x128_bf16_rc on H200-SXM-141GB \(and 1 more"):
        run(ExportArgs(out=str(tmp_path / out), format=fmt, shapes="256x128", tokens="16,32", gpu="h200", measured=db))
    assert not (tmp_path / out).exists() and {p.name for p in tmp_path.iterdir()} <= {"m.sqlite", "m.sqlite-wal",
                                                                                     "m.sqlite-shm"}


@pytest.mark.parametrize("out", ["tuned", "tuned/", "new/"])
def test_triton_refuses_a_folder_for_its_module(tmp_path, checkpoint, out):
    (tmp_path / "tuned").mkdir()
    with pytest.raises(ExportError, match=f"--out .*{out} is a folder; --format triton writes one Python module: "
                                          f"name its file, such as .*{out.rstrip('/')}/configs.py"):
        run(ExportArgs(out=f"{tmp_path}/{out}", format="triton", shapes="64x32", gpu="h200", checkpoint=checkpoint))
    assert [p.name for p in tmp_path.iterdir()] == ["tuned"] and not any((tmp_path / "tuned").iterdir())


def test_vllm_refuses_a_file_for_its_folder(tmp_path, checkpoint):
    module = tmp_path / "configs.py"
    module.write_text("CONFIGS = {}\n")
    with pytest.raises(ExportError, match=f"--out {module} is a file; --format vllm writes a folder of JSON files"):
        run(ExportArgs(out=str(module), shapes="64x32", gpu="h200", checkpoint=checkpoint))
    with pytest.raises(ExportError, match=f"--out {module}/v: {module} is a file, not a folder"):
        run(ExportArgs(out=str(module / "v"), shapes="64x32", gpu="h200", checkpoint=checkpoint))
    assert module.read_text() == "CONFIGS = {}\n" and [p.name for p in tmp_path.iterdir()] == ["configs.py"]


def test_measured_refuses_a_file_that_is_not_a_database(tmp_path):
    empty, text = tmp_path / "empty.md", tmp_path / "README.md"
    empty.touch()
    text.write_text("# not a database\n")
    with pytest.raises(DatabaseError, match=f"{empty}: an empty file, not a gnn-policy database"):
        run(ExportArgs(out=str(tmp_path / "v"), shapes="64x32", gpu="h200", measured=str(empty)))
    with pytest.raises(DatabaseError, match=f"{text}: not a readable SQLite database"):
        run(ExportArgs(out=str(tmp_path / "v"), shapes="64x32", gpu="h200", measured=str(text)))
    assert empty.read_bytes() == b"" and text.read_text() == "# not a database\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "empty.md"]


@pytest.fixture()
def tour(tmp_path, monkeypatch):
    """A user's folder, the working directory: a tuned/ folder holding a module, and an empty file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "configs.py").write_text("CONFIGS = {}\n")
    (tmp_path / "empty.md").touch()
    return tmp_path


def _untouched(tour):
    assert sorted(str(p.relative_to(tour)) for p in tour.rglob("*")) == ["empty.md", "tuned", "tuned/configs.py"]
    assert (tour / "tuned" / "configs.py").read_text() == "CONFIGS = {}\n"


@pytest.mark.parametrize("argv, says", [
    (["--format", "triton", "--out", "tuned/"], "--out tuned/ is a folder; --format triton writes one Python module"),
    (["--format", "triton", "--out", "e4/"], "--out e4/ is a folder; --format triton writes one Python module"),
    (["--out", "tuned/configs.py"], "--out tuned/configs.py is a file; --format vllm writes a folder of JSON files"),
    (["--measured", "empty.md", "--out", "em/"], "empty.md: an empty file, not a gnn-policy database"),
])
def test_the_command_refuses_in_one_line(tour, capsys, checkpoint, argv, says):
    assert main(["export", "--shapes", "64x32", "--gpu", "h200", "--checkpoint", checkpoint, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gnn-policy export: {says}") and err.count("\n") == 1  # one line, no traceback
    _untouched(tour)


def test_top_k_must_be_at_least_one(tour, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["export", "--shapes", "64x32", "--format", "triton", "--top-k", "0", "--out", "e2.py"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]  # argparse's: its usage, then this line
    assert last == "gnn-policy export: error: argument --top-k: must be at least 1, got 0"
    with pytest.raises(ValueError, match="--top-k: must be at least 1, got 0"):  # a --config file's value
        build(ExportArgs, {"out": "e2.py", "top_k": 0})
    _untouched(tour)


def test_a_write_that_fails_part_way_is_one_error_and_leaves_nothing(tmp_path, checkpoint, monkeypatch):
    """vllm writes several files: a disk that refuses the second leaves none of them, not a half set."""
    from pathlib import Path

    write_text, calls = Path.write_text, []

    def failing(self, text, *args, **kwargs):
        calls.append(self)
        if len(calls) == 2:  # as a full disk does: part of the file is there when the write fails
            write_text(self, text[:10], *args, **kwargs)
            raise OSError(28, "No space left on device", str(self))
        return write_text(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(ExportError, match="cannot write .*No space left on device; nothing was written"):
        run(ExportArgs(out=str(tmp_path / "v"), shapes="64x64,128x64", tokens="1", gpu="h200", checkpoint=checkpoint))
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []  # the folder it made is gone too


def test_an_export_from_measurements_never_writes_into_their_database(tmp_path, monkeypatch):
    from gnn_policy import snapshot

    shipped = tmp_path / "shards"  # a shipped shard holding the problem the user's database lacks
    other = _measured_db(tmp_path / "other.sqlite", GemmProblem(32, 256, 128, b_layout="col"))
    with Database(other) as db:
        snapshot.export_run(db, shipped, H200.name, "sweep", (0, 0), "t")
    monkeypatch.setattr(snapshot, "SHIPPED", shipped)
    db = _measured_db(tmp_path / "m.sqlite", GemmProblem(16, 256, 128, b_layout="col"))
    before = (tmp_path / "m.sqlite").read_bytes()
    out = run(ExportArgs(out=str(tmp_path / "v"), shapes="256x128", tokens="16,32", gpu="h200", measured=db))
    assert (tmp_path / "m.sqlite").read_bytes() == before
    assert [s["what"] for s in out["skipped"]] == ["256x128 at 32 tokens"]  # the user's rows alone
