"""finetune --keys: the budget goes to exactly the GEMMs a user names, each measured down the
start's own ranking, its first pick first."""
import json

import pytest

import hardware_specs
from graphs import GemmProblem
from gnn_policy.cli import parse
from gnn_policy.database import Database
from gnn_policy.policy import Policy
from training import finetune
from training.finetune import FinetuneArgs, run

H200 = hardware_specs.load("h200")
KEYS = ["1x16x4096x4096_bf16_rc_bgelu", "1x777x1000x333_fp16_rr", "4x128x64x256_bf16_rc"]


def _args(tmp_path, ckpt, **kw):
    base = dict(gpu="h200", budget="6", db=str(tmp_path / "m.sqlite"), checkpoint=str(ckpt), keys=",".join(KEYS),
                output=str(tmp_path / "out"), problems=8, rounds=1, steps=1, runner="fake_runner:measure",
                guard=False, wandb=False)
    return FinetuneArgs(**{**base, **kw})


def test_keys_tune_exactly_the_named_gemms_in_order_down_the_starts_ranking(tmp_path, ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)  # the fake runner stands in for the H200
    card = run(_args(tmp_path, ckpt))
    assert card["problems"] == KEYS and card["spent_measurements"] == 6
    start = Policy.load(ckpt)  # cost_model 0: its first pick is the first-pick rule's, not the best predicted
    with Database(tmp_path / "m.sqlite") as db:
        assert {p.key for p in db.problems(H200.name)} == set(KEYS)
        for key in KEYS:
            rows = db.tflops(H200.name, key, "real")
            # the GEMMs a user serves are measured down the policy's own ranking, its first pick first
            ranked = [pick.config.key for pick in start.top_k(GemmProblem.from_key(key), H200, 2)]
            first = next(r["config"] for r in db.rows_after(0) if r["problem"] == key)
            assert set(rows) == set(ranked) and first == start.top_k(GemmProblem.from_key(key), H200, 1)[0].config.key
            assert card["measured_winners"][key]["tflops"] == max(rows.values()) >= rows[first]


def test_keys_from_a_file_skip_comments_and_repeats_and_a_cap_says_what_it_leaves(tmp_path, ckpt, monkeypatch, capsys):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    listed = tmp_path / "serve.txt"
    listed.write_text(f"# the GEMMs we serve\n{KEYS[1]}\n\n{KEYS[0]}  # attention out\n{KEYS[1]}\n{KEYS[2]}\n")
    card = run(_args(tmp_path, ckpt, keys=f"@{listed}", problems=2, budget="2"))
    assert card["problems"] == [KEYS[1], KEYS[0]]
    assert "tuning on the first 2 of 3 --keys (--problems 2)" in capsys.readouterr().err


def test_a_bad_key_a_missing_file_and_keys_beside_a_split_or_model_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="not a GemmProblem key: '16x4096x4096'"):
        FinetuneArgs(gpu="h200", keys=f"{KEYS[0]},16x4096x4096")
    with pytest.raises(SystemExit) as exit_:
        parse(["finetune", "--gpu", "h200", "--keys", "1x16x4096x4096_bf16"])
    assert exit_.value.code == 2 and "argument --keys: not a GemmProblem key: '1x16x4096x4096_bf16'" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match="'1x16x64x64_bf17_rr': GemmProblem.dtype must be one of"):
        FinetuneArgs(gpu="h200", keys="1x16x64x64_bf17_rr")
    with pytest.raises(ValueError, match="cannot read .*missing.txt"):
        FinetuneArgs(gpu="h200", keys=f"@{tmp_path / 'missing.txt'}")
    with pytest.raises(ValueError, match="no problem key in ' , '"):
        FinetuneArgs(gpu="h200", keys=" , ")
    for other in ({"split": "train"}, {"model": "gpt2"}):
        with pytest.raises(ValueError, match=f"--keys and --{next(iter(other))} are exclusive"):
            FinetuneArgs(gpu="h200", keys=KEYS[0], **other)
    with pytest.raises(ValueError, match="at most 2048 measurements per tuning problem, 4096 for 2 \\(--keys\\)"):
        FinetuneArgs(gpu="h200", keys=",".join(KEYS[:2]), budget="5000")


def test_a_replay_tunes_on_the_keys_it_holds_and_says_when_it_holds_none(tmp_path, ckpt, capsys):
    from gnn_policy.collect import CollectArgs, run as collect
    from training.finetune_budget import FinetuneError

    source = str(tmp_path / "source.sqlite")
    collect(CollectArgs(db=source, gpu="h200", split="test", problems=2, configs=6, runner="fake_runner:measure"))
    with Database(source) as db:
        held = sorted(p.key for p in db.problems(H200.name))
    card = run(_args(tmp_path, ckpt, keys=",".join([KEYS[0], *held]), replay=source, snapshot=False, budget="4"))
    assert card["problems"] == held
    assert "the replay holds rows of 2 of the 3 --keys" in capsys.readouterr().err
    with pytest.raises(FinetuneError, match="has no rows of H200-SXM-141GB for any of the --keys"):
        run(_args(tmp_path, ckpt, keys=KEYS[0], replay=source, snapshot=False, output=str(tmp_path / "o2"),
                  db=str(tmp_path / "m2.sqlite")))


@pytest.mark.parametrize("budget, counts", [("4", [2, 2, 0]), ("5", [2, 2, 1]), ("9", [3, 3, 3])])
def test_a_budget_short_of_two_a_gemm_measures_the_first_ones_in_pairs(tmp_path, ckpt, monkeypatch, budget, counts):
    # one measurement of a served GEMM confirms its pick and gains nothing; two may find a better one
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    card = run(_args(tmp_path, ckpt, budget=budget, rounds=2))
    with Database(tmp_path / "m.sqlite") as db:
        assert [len(db.tflops(H200.name, key, "real")) for key in KEYS] == counts
    assert card["spent_measurements"] == int(budget)


def test_the_cli_prints_each_gemms_start_pick_against_its_best_measured_and_the_card_with_json(tmp_path, ckpt, capsys):
    from gnn_policy.cli import main
    from gnn_policy.collect import CollectArgs, run as collect

    source = str(tmp_path / "source.sqlite")
    collect(CollectArgs(db=source, gpu="h200", split="test", problems=2, configs=6, runner="fake_runner:measure"))
    with Database(source) as db:
        held = sorted(p.key for p in db.problems(H200.name))
        stored = {key: db.tflops(H200.name, key) for key in held}
    argv = ["finetune", "--gpu", "h200", "--keys", ",".join(held), "--replay", source, "--no-snapshot", "--budget", "6",
            "--rounds", "1", "--checkpoint", str(ckpt), "--db", str(tmp_path / "m.sqlite"), "--output",
            str(tmp_path / "out"), "--no-wandb"]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("finetune H200-SXM-141GB (real): 6 measurements on 2 GEMMs")
    assert f"checkpoint: {tmp_path / 'out' / 'h200.pt'}" in shown
    assert main(argv + ["--json"]) == 0  # finished: the same card again
    card = json.loads(capsys.readouterr().out)
    for key in held:
        win = card["measured_winners"][key]
        # the start pick was measured first, and the winner is the best of what was measured
        assert win["start_tflops"] == round(stored[key][win["start_pick"]], 2) <= win["tflops"]
        line = next(row for row in shown.splitlines() if row.startswith(key))
        assert win["start_pick"] in line and win["config"] in line and f"{win['tflops'] / win['start_tflops']:.2f}x" in line
    assert "geomean gain over the 2 GEMMs whose start pick was measured" in shown


def test_a_killed_run_resumed_gives_the_pairs_to_the_gemms_still_short_of_them(tmp_path, ckpt):
    import contextlib

    from gnn_policy.collect import CollectArgs, run as collect

    source = str(tmp_path / "source.sqlite")
    collect(CollectArgs(db=source, gpu="h200", split="test", problems=3, configs=8, runner="fake_runner:measure"))
    with Database(source) as db:
        held = sorted(p.key for p in db.problems(H200.name))
    args = _args(tmp_path, ckpt, keys=",".join(held), replay=source, snapshot=False, budget="4", rounds=1)
    real = finetune.measurer

    @contextlib.contextmanager
    def killed_after_the_first_gemm(*a, **kw):
        with real(*a, **kw) as measure:
            many = measure.many

            def first_only(jobs):
                many(jobs[:1])
                raise KeyboardInterrupt
            measure.many = first_only
            yield measure

    finetune.measurer = killed_after_the_first_gemm
    try:
        with pytest.raises(Exception, match="run the same command again to resume"):
            run(args)
    finally:
        finetune.measurer = real
    card = run(args)
    with Database(tmp_path / "m.sqlite") as db:
        assert [len(db.tflops(H200.name, key, "real")) for key in held] == [2, 2, 0]
    assert card["spent_measurements"] == 4
