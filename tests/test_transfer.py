"""gnn-policy transfer: the whole protocol as a CPU dry run on analytic labels, and its refusals."""
import csv
import dataclasses

import pytest
import torch

import hardware_specs
from gnn_policy.database import Database
from gnn_policy.interrupts import Interrupted
from gnn_policy.model import ModelConfig, PolicyModel
from training.transfer import TransferArgs, TransferError, check_held_out, measurements_to_reach, run, with_folders

L40S = hardware_specs.load("l40s")


def _checkpoint(path, gpus, seed=0):
    torch.manual_seed(seed)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=gpus))
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return str(path)


def _args(tmp_path, **kw):
    base = dict(target="l40s", plain=_checkpoint(tmp_path / "plain.pt", ("H200-SXM-141GB",)),
                meta=_checkpoint(tmp_path / "meta.pt", ("H200-SXM-141GB", "A100-SXM4-80GB"), seed=1),
                budgets="0,4", problems=2, tune_problems=2, rounds=1, steps=1, simulate=True,
                db=str(tmp_path / "eval.sqlite"), work=str(tmp_path / "work"), out=str(tmp_path / "out"),
                wandb=False)
    return TransferArgs(**{**base, **kw})


def test_a_simulated_transfer_reports_every_method_at_every_budget(tmp_path):
    out = run(_args(tmp_path))
    rows = list(csv.DictReader((tmp_path / "out" / "transfer.csv").open()))
    runs = {(r["method"], r["budget"]) for r in rows}
    assert runs == {(m, b) for m in ("meta", "plain", "scratch", "served") for b in ("0", "4")} | \
        {("random", "4"), ("evolutionary", "4")} | {(m, "") for m in ("analytic", "triton_tutorial", "inductor_mm")}
    assert len(rows) == 2 * len(runs) and out["problems"] == 2
    assert all(0 < float(r["top1"]) <= float(r["top8"]) <= 1 + 1e-9 for r in rows)
    # with analytic labels, best known is the analytic model's optimum, so its own top-1 is exact
    assert all(float(r["top1"]) == 1.0 for r in rows if r["method"] == "analytic")
    # the simulated evaluation has a database of its own, never --db
    assert not (tmp_path / "eval.sqlite").exists() and list((tmp_path / "work").glob("simulated-*.sqlite"))
    # each fine-tune learns from its own B measurements alone, in its own database
    with Database(next((tmp_path / "work").glob("meta-B4-s0-*.sqlite"))) as db:
        assert db.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 4
    assert (tmp_path / "out" / "transfer.png").stat().st_size > 0
    md = (tmp_path / "out" / "transfer.md").read_text()
    assert "| meta |" in md
    # by size: each partition covers both problems, one row per method and budget run
    header = next(line for line in md.splitlines() if line.startswith("| method | B |"))
    counts = [int(c.split("(")[1].rstrip(")")) for c in header.strip("| ").split(" | ")[2:]]
    assert counts[0] + counts[1] == counts[2] + counts[3] == 2
    assert sum(line.startswith("| meta | ") for line in md.splitlines()) == 1 + 2  # B table, then B=0 and 4
    # each fine-tune says which weights its guard kept (the verdicts themselves: the next test)
    tuned = ("meta", "plain", "scratch", "served")
    assert {r["kept"] for r in rows if r["budget"] == "4" and r["method"] in tuned} <= {"adapted", "start", "unjudged"}
    assert {r["kept"] for r in rows if r["budget"] != "4" or r["method"] not in tuned} == {""}
    assert "Fine-tunes that kept their adapted weights: " in md

    # the report and W&B runs rebuilt from the CSV alone (a GPU machine without wandb wrote it)
    (tmp_path / "out" / "transfer.md").unlink()
    again = run(TransferArgs(out=str(tmp_path / "out"), work=str(tmp_path / "work2"), report_only=True))
    assert again["report"] == out["report"] and (tmp_path / "out" / "transfer.md").read_text().strip() == out["report"]
    assert list((tmp_path / "work2" / "wandb").rglob("offline-run-*"))


def test_a_run_needs_a_target_and_a_plain_checkpoint(tmp_path):
    with pytest.raises(TransferError, match="--target and --plain are required"):
        run(TransferArgs(out=str(tmp_path)))


def test_a_checkpoint_that_saw_the_target_is_refused(tmp_path):
    seen = _checkpoint(tmp_path / "seen.pt", ("L40S",))
    with pytest.raises(TransferError, match=r"--plain .*seen.pt was trained on L40S, the held-out target"):
        run(_args(tmp_path, plain=seen))


def test_a_checkpoint_taught_by_a_simulator_fitted_on_the_target_is_refused(tmp_path):
    import json

    args = _args(tmp_path, target="h200", simulate=False, meta=_checkpoint(tmp_path / "m.pt", ("L40S",)),
                 plain=_checkpoint(tmp_path / "p.pt", ("L40S",)))
    (tmp_path / "m.card.json").write_text(json.dumps({"simulator": {"fitted_on": ["H200-SXM-141GB"]}}))
    with pytest.raises(TransferError, match=r"--meta .*analytic model fitted on H200-SXM-141GB"):
        check_held_out(args, "H200-SXM-141GB")


def test_each_target_gets_its_own_report_and_work_folders_unless_told():
    h200, sm48 = with_folders(TransferArgs(target="h200")), with_folders(TransferArgs(target="h200-sm48"))
    assert (h200.out, h200.work) == ("docs/data/transfer/h200-sxm-141gb", "runs/transfer/h200-sxm-141gb")
    assert (sm48.out, sm48.work) == ("docs/data/transfer/h200-sxm-141gb-sm48", "runs/transfer/h200-sxm-141gb-sm48")
    assert with_folders(TransferArgs(target="H200-SXM-141GB")).out == h200.out  # any alias: one folder
    assert with_folders(TransferArgs(target="h200", out="elsewhere")).out == "elsewhere"
    assert with_folders(TransferArgs(report_only=True, out="docs/data/transfer/x")).work == "runs/transfer/x"
    with pytest.raises(TransferError, match="give --target"):
        run(TransferArgs(report_only=True))


def test_measurements_to_reach_takes_the_first_budget_that_gets_there():
    table = {("scratch", 0): {"top1": 0.5}, ("scratch", 16): {"top1": 0.7}, ("scratch", 64): {"top1": 0.9},
             ("scratch", 256): {"top1": 0.96}}
    assert measurements_to_reach(table, "scratch", 0.5) == 0
    assert measurements_to_reach(table, "scratch", 0.9) == 64
    assert measurements_to_reach(table, "scratch", 0.99) is None


def test_a_time_limited_transfer_stops_between_runs_and_a_rerun_finishes(tmp_path, monkeypatch):
    import training.transfer as transfer

    # each reading 40 s later, one after every run: runs start at 0, 40 and 80 s, and the check
    # after the third (120 s) is past the 1.5-minute limit
    clock = iter(range(0, 10**6, 40))
    monkeypatch.setattr(transfer, "monotonic", lambda: next(clock))
    first = run(_args(tmp_path, time_limit=1.5))
    assert first["stopped_by_time_limit"] == 1 and "after 3 of 13 runs" in first["report"]
    assert not (tmp_path / "out" / "transfer.csv").exists()
    # the three finished runs (B=0: meta, plain, scratch) are reported as partial
    partial = (tmp_path / "out" / "transfer.partial.md").read_text()
    assert partial.startswith("Partial: 3 of 13 runs finished") and "| meta |" in partial and "| random |" not in partial
    # what the methods spend names only those that ran
    assert "Measurements on the target: meta, plain, scratch spend B in all; their top-8 costs 8 a problem." in partial
    assert len(list(csv.DictReader((tmp_path / "out" / "transfer.partial.csv").open()))) == 3 * 2
    monkeypatch.undo()
    second = run(_args(tmp_path))
    assert "stopped_by_time_limit" not in second and (tmp_path / "out" / "transfer.csv").exists()
    assert not list((tmp_path / "out").glob("transfer.partial.*"))


def test_a_measured_transfer_exports_a_shard_per_run_and_resumes_after_its_time_limit(tmp_path, monkeypatch):
    from gnn_policy.collect import CollectArgs, run as collect
    from training import finetune

    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)  # the fake runner stands in for the H200

    db = str(tmp_path / "m.sqlite")
    collect(CollectArgs(db=db, gpu="h200", split="test", problems=2, configs=6, runner="fake_runner:measure"))
    with Database(db) as d:
        before = d.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    shards = tmp_path / "shards"
    args = _args(tmp_path, target="h200", simulate=False, runner="fake_runner:measure", db=db, shard_dir=str(shards),
                 plain=_checkpoint(tmp_path / "p.pt", ("L40S",)), meta=_checkpoint(tmp_path / "m.pt", ("L40S",), 1))

    def killed(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("gnn_policy.snapshot.export_run", killed)  # the call is killed before its first export
    with pytest.raises(Interrupted):
        run(args)
    monkeypatch.undo()
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    assert not shards.exists()

    first = run(dataclasses.replace(args, time_limit=1e-6))  # the limit passes during the first run
    assert first["stopped_by_time_limit"] == 1 and "after 1 of" in first["report"]
    assert not (tmp_path / "out" / "transfer.csv").exists()
    # meta's B=0 picks, measured by the killed call, are exported at the start; its re-run measures nothing
    [shard] = shards.glob("*.jsonl.gz")
    assert shard.name.endswith("-recovered.jsonl.gz") and first["shard_rows"] > 0

    done = run(args)
    assert "stopped_by_time_limit" not in done and (tmp_path / "out" / "transfer.csv").exists()
    assert not list(shards.glob("*-meta-B0-s0.jsonl.gz")) and list(shards.glob("*-plain-B0-s0.jsonl.gz"))
    with Database(db) as d:
        after = d.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    assert first["shard_rows"] + done["shard_rows"] == after - before  # every evaluation row is in one shard


def test_each_fine_tune_reports_the_weights_its_guard_kept_and_a_fallback_picks_as_b0(tmp_path, monkeypatch):
    from training import guard
    from training.guard import CheckResult

    # the fine-tunes run in the order meta, plain, scratch, served: meta's adaptation wins the
    # cross-fit, plain's and served's lose it, and scratch's cannot be judged
    verdicts = iter([CheckResult(0.8, 0.9, 2), CheckResult(0.8, 0.7, 2), CheckResult(None, None, 0),
                     CheckResult(0.8, 0.7, 2)])
    monkeypatch.setattr(guard, "cross_fit", lambda *a, **k: next(verdicts))
    run(_args(tmp_path, lr=0.05))
    rows = list(csv.DictReader((tmp_path / "out" / "transfer.csv").open()))
    kept = {r["method"]: r["kept"] for r in rows if r["budget"] == "4" and r["kept"]}
    assert kept == {"meta": "adapted", "plain": "start", "scratch": "unjudged", "served": "start"}
    picks = {(r["method"], r["budget"], r["problem"]): r["top8"] for r in rows}
    for m in ("plain", "scratch", "served"):  # the starting weights pick what B = 0 picks (a simulation keeps no winners)
        assert all(v == picks[m, "0", p] for (mm, b, p), v in picks.items() if (mm, b) == (m, "4"))
    md = (tmp_path / "out" / "transfer.md").read_text()
    assert "kept their adapted weights: meta B=4. Fell back to the starting weights because the guard's " \
           "cross-fit found them no better: plain B=4, served B=4; because too few configs were measured to judge them: " \
           "scratch B=4." in md
    # a re-run reads the verdicts back from runs.jsonl
    assert run(_args(tmp_path, lr=0.05))["runs"] == 0
    assert (tmp_path / "out" / "transfer.md").read_text() == md


def test_a_rerun_on_a_fresh_machine_reuses_the_finished_runs_of_the_same_settings(tmp_path, capsys, monkeypatch):
    import shutil

    from training.transfer_log import TransferLog

    first = run(_args(tmp_path))
    log = tmp_path / "out" / "runs.jsonl"
    assert first["runs"] == 13 and len(log.read_text().splitlines()) == 13
    with log.open("a") as f:
        f.write('{"settings": "cut short by a kill')

    # a fresh machine: no fine-tune states in --work (the simulated evaluation database stays,
    # as the real one is rebuilt from the shards): nothing is fine-tuned or searched again
    for done in (tmp_path / "work").glob("*-B4-s0*"):
        shutil.rmtree(done) if done.is_dir() else done.unlink()
    again = run(_args(tmp_path))
    assert again["runs"] == 0 and again["report"] == first["report"]  # the guard's verdicts come from the log too
    assert not list((tmp_path / "work").glob("meta-B4-s0-*"))
    assert "1 lines of" in capsys.readouterr().out

    # other fine-tune settings: only the four fine-tunes run again, beside the old lines
    changed = run(_args(tmp_path, lr=1e-2))
    assert changed["runs"] == 4 and len(list((tmp_path / "work").glob("meta-B4-s0-*.sqlite"))) == 1
    reread = TransferLog(log)
    assert len(reread.runs) == 17 and reread.damaged == 1  # the cut line stays alone on its line

    # the fine-tune's losses changed: again only the fine-tunes run
    monkeypatch.setattr("training.transfer_picks.ADAPT_VERSION", 99)
    assert run(_args(tmp_path))["runs"] == 4
    assert len(list((tmp_path / "work").glob("meta-B4-s0-*.sqlite"))) == 2  # beside lr=1e-2's, not over it

    # another evaluation (one problem): every run is valued again, each finished fine-tune reused
    # but served's, which tunes on the evaluated problems
    other = run(_args(tmp_path, problems=1))
    assert other["runs"] == 13 and len(list((tmp_path / "work").glob("meta-B4-s0-*.sqlite"))) == 2
    assert len(list((tmp_path / "work").glob("served-B4-s0-*.sqlite"))) == 3

    # a database without the measurements behind the log: the picks score as failures, and it says so
    alone = run(_args(tmp_path, work=str(tmp_path / "empty")))
    assert alone["runs"] == 0 and "picks have no row in" in capsys.readouterr().out
    assert all(float(r["top1"]) == 0.01 for r in csv.DictReader((tmp_path / "out" / "transfer.csv").open()))


def test_a_replayed_transfer_chooses_among_stored_configs_and_values_them_as_stored(tmp_path):
    import json

    from gnn_policy.collect import CollectArgs, run as collect

    source = str(tmp_path / "source.sqlite")
    for split, configs in (("train", 12), ("test", 24)):  # fine-tunes tune on train, the methods are scored on test
        collect(CollectArgs(db=source, gpu="l40s", split=split, problems=2, configs=configs, runner="fake_runner:measure"))
    with Database(source) as db:
        figures = {p.key: {k: v for k, v in db.tflops(L40S.name, p.key).items() if k != "cublas"}
                   for p in db.problems(L40S.name)}
    out = run(_args(tmp_path, simulate=False, replay=source, runner="no.such:runner"))  # no GPU, no runner
    rows = list(csv.DictReader((tmp_path / "out" / "transfer.csv").open()))
    assert {(r["method"], r["budget"]) for r in rows} == {(m, b) for m in ("meta", "plain", "scratch", "served")
                                                          for b in ("0", "4")} \
        | {("random", "4"), ("evolutionary", "4")} | {(m, "") for m in ("analytic", "triton_tutorial", "inductor_mm")}
    assert out["problems"] == 2 and {r["source"] for r in rows} == {"replayed real"}
    assert "replayed real labels" in out["report"]
    # every pick is a stored config of its problem, valued at its stored figure over the best stored
    picks = [json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    for run_ in picks:
        for problem, keys in run_["picks"].items():
            assert all(k is None or k in figures[problem] for k in keys)
    for r in rows:
        stored = figures[r["problem"]]
        assert any(abs(float(r["top1"]) - round(v / max(stored.values()), 4)) < 1e-9 for v in stored.values()) \
            or float(r["top1"]) == 0.01
    # --db is never written; the methods' rows went to an evaluation database of the replay's own
    assert not (tmp_path / "eval.sqlite").exists() and list((tmp_path / "work").glob("replay-*.sqlite"))
    with Database(next((tmp_path / "work").glob("meta-B4-s0-*.sqlite"))) as db:  # a fine-tune's own B rows
        assert db.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 4
    # served spends its B on the evaluated problems themselves and picks the best it measured there,
    # so on every problem its first pick is at least its start's, plain at B = 0
    top1 = {(r["method"], r["budget"], r["problem"]): float(r["top1"]) for r in rows}
    with Database(next((tmp_path / "work").glob("served-B4-s0-*.sqlite"))) as db:
        tuned = {p.key for p in db.problems(L40S.name)}
        assert tuned == {r["problem"] for r in rows} and db.conn.execute(
            "SELECT COUNT(*) FROM measurements").fetchone()[0] == 4
        for key in tuned:
            measured = db.tflops(L40S.name, key)
            assert top1["served", "4", key] == round(max(measured.values()) / max(figures[key].values()), 4)
            assert top1["served", "4", key] >= top1["plain", "0", key]
    with pytest.raises(ValueError, match="--replay answers from stored real rows, --simulate"):
        _args(tmp_path, replay=source)
    assert with_folders(TransferArgs(target="h200", replay=source)).out == "docs/data/transfer/h200-sxm-141gb-replay"
    with pytest.raises(ValueError, match="--tune-split random-test is the split evaluated"):
        TransferArgs(split="random-test", tune_split="random-test")


def test_methods_chooses_which_runs_go_and_an_unknown_one_is_refused(tmp_path):
    out = run(_args(tmp_path, methods="plain, served,analytic", meta=str(tmp_path / "no-meta.pt")))  # unused: need not exist
    rows = list(csv.DictReader((tmp_path / "out" / "transfer.csv").open()))
    assert {(r["method"], r["budget"]) for r in rows} == {("plain", "0"), ("plain", "4"), ("served", "0"),
                                                          ("served", "4"), ("analytic", "")}
    assert out["runs"] == 5 and "| meta |" not in out["report"]
    with pytest.raises(ValueError, match="--methods: meat, grid are not one of meta, plain, scratch, served, random"):
        _args(tmp_path, methods="meat,plain,grid")
    # a --meta that saw the target is refused only when meta runs
    saw = _checkpoint(tmp_path / "saw.pt", (L40S.name,))
    check_held_out(_args(tmp_path, meta=saw, methods="plain,served", simulate=False), L40S.name)
    with pytest.raises(TransferError, match="--meta .*saw.pt was trained on L40S"):
        check_held_out(_args(tmp_path, meta=saw, simulate=False), L40S.name)
    # served tunes on the evaluated problems: a budget they cannot hold is refused before any run
    with pytest.raises(TransferError, match="--budgets 4097: served fine-tunes on the 2 problems evaluated, at most "
                                            "2048 measurements each"):
        run(_args(tmp_path, budgets="0,4097", tune_problems=3, work=str(tmp_path / "w2"), out=str(tmp_path / "o2")))
