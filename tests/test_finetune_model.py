"""finetune --model SPEC --tokens LIST: the budget goes to the GEMMs tune --model picks for."""
import json

import pytest

import hardware_specs
from graphs import GemmProblem
from graphs.model_config import ConfigError
from gnn_policy.cli import main, parse
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.search import valid_configs
from gnn_policy.space import space
from gnn_policy.tune import TuneArgs, run as tune
from training import finetune
from training.finetune import FinetuneArgs, FinetuneError, run
from training.transfer_log import file_digest
from training.tuning_problems import expand

H200 = hardware_specs.load("h200")
# 7 distinct GEMMs a token count: q, k and v (one computation), o, gate, up, down, lm_head
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 256}


@pytest.fixture()
def tiny(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def _args(tmp_path, ckpt, model, **kw):
    base = dict(gpu="h200", budget="4", db=str(tmp_path / "m.sqlite"), checkpoint=str(ckpt), model=str(model),
                tokens="1,16", output=str(tmp_path / "out"), problems=3, rounds=1, steps=1,
                runner="fake_runner:measure", wandb=False)
    return FinetuneArgs(**{**base, **kw})


def test_the_problems_are_the_distinct_gemms_tune_picks_for(ckpt):
    rows = tune(TuneArgs(model="llama-3-8b", tokens="1,2048", gpu="h200", checkpoint=str(ckpt)))["rows"]
    model = expand("llama-3-8b", "1,2048", "bf16")
    assert [p.key for p in model.problems] != [r["problem"] for r in rows]  # a cap's order: in turn per token count
    assert sorted(p.key for p in model.problems) == sorted(r["problem"] for r in rows) and len(rows) == 14
    for r in rows:
        assert model.shared[r["problem"]] == {"tokens": [r["tokens"]], "layers": r["layers"]}
    moe = expand("mixtral-8x7b", "15,16", "bf16")  # 30 and 32 routed rows: the same 8 experts' GEMMs of 4 rows each
    assert moe.shared["8x4x28672x4096_bf16_rc"] == {"tokens": [15, 16], "layers": ["mlp.experts.gate_up_proj"]}
    assert len({p.key for p in moe.problems}) == len(moe.problems)  # tuned once
    shares = tune(TuneArgs(model="llama-3-8b", tokens="16", tp=2, gpu="h200", checkpoint=str(ckpt)))["rows"]
    assert sorted(p.key for p in expand("llama-3-8b", "16", "bf16", tp=2).problems) == sorted(r["problem"] for r in shares)


def test_model_and_split_are_exclusive_and_tokens_need_a_model(capsys):
    with pytest.raises(ValueError, match="--model and --split val are exclusive"):
        FinetuneArgs(gpu="h200", model="gpt2", split="val")
    with pytest.raises(SystemExit) as exit_:
        parse(["finetune", "--gpu", "h200", "--model", "gpt2", "--split", "train"])
    assert exit_.value.code == 2 and "--model and --split train are exclusive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--tokens sets the token counts of --model's GEMMs"):
        FinetuneArgs(gpu="h200", tokens="1,16")
    with pytest.raises(ValueError, match="--tp splits the GEMMs of --model's config"):
        FinetuneArgs(gpu="h200", tp=2)
    with pytest.raises(SystemExit):
        parse(["finetune", "--gpu", "h200", "--model", "gpt2", "--tokens", "1,x"])
    assert "argument --tokens" in capsys.readouterr().err


@pytest.mark.parametrize("change, needle", [
    ({"num_hidden_layers": None}, "field 'num_hidden_layers' is missing"),
    ({"hidden_size": "64"}, "field 'hidden_size' must be a positive integer, got '64'"),
    ({"vocab_size": 0}, "field 'vocab_size' must be a positive integer, got 0"),
])
def test_a_bad_spec_names_its_field_before_anything_is_measured_or_written(tmp_path, ckpt, capsys, change, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in {**TINY, **change}.items() if v is not None}))
    with pytest.raises(ConfigError, match=needle):
        run(_args(tmp_path, ckpt, bad))
    argv = ["finetune", "--gpu", "h200", "--simulate", "--model", str(bad), "--db", str(tmp_path / "m.sqlite"),
            "--checkpoint", str(ckpt), "--output", str(tmp_path / "out"), "--no-wandb"]
    assert main(argv) == 2 and needle in capsys.readouterr().err
    assert main([*argv[:5], str(tmp_path / "missing.json"), *argv[6:]]) == 2
    assert "no model config at" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "start.pt"]  # no database, no output


def test_the_plan_and_card_record_the_model_and_a_cap_says_what_it_cuts(tmp_path, ckpt, tiny, capsys, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)  # the fake runner stands in for the H200
    card = run(_args(tmp_path, ckpt, tiny))
    assert "tiny has 14 distinct GEMMs over tokens 1,16; tuning on 3 of them (--problems 3)" in capsys.readouterr().err
    tuned = card["model"]["tuned"]
    assert card["spent_measurements"] == 4 and [t["problem"] for t in tuned] == card["problems"]
    assert card["model"] | {"tuned": None} == {"spec": str(tiny), "name": "tiny", "tokens": [1, 16], "tp": 1,
                                               "digest": file_digest(tiny), "distinct": 14, "tuned": None}
    assert tuned[1] == {"problem": "1x16x32x64_bf16_rc", "tokens": [16],
                        "layers": ["self_attn.k_proj", "self_attn.v_proj"]}
    plan = json.loads((tmp_path / "out" / "h200.finetune.json").read_text())["plan"]
    assert (plan["model"], plan["tokens"], plan["model_digest"], plan["split"]) == (str(tiny), "1,16",
                                                                                    file_digest(tiny), "")
    tiny.write_text(json.dumps({**TINY, "intermediate_size": 256}))  # another model under the same path
    with pytest.raises(FinetuneError, match="belongs to a run with"):
        run(_args(tmp_path, ckpt, tiny))


def test_the_budget_check_counts_the_model_problems_after_expansion(tmp_path, ckpt, tiny):
    # --problems 8 would allow 16,384; tokens 1 gives 7 distinct GEMMs, so 14,336 at most
    with pytest.raises(FinetuneError, match="at most 2048 measurements per tuning problem, 14336 for 7"):
        run(_args(tmp_path, ckpt, tiny, tokens="1", problems=8, budget="14337", simulate=True))


def _store(path, problem):
    with Database(path) as db:
        db.add([(Measurement(H200.name, problem.key, c.key, "ok", median_ms=1.0, tflops=float(i + 1)), problem, c)
                for i, c in enumerate(valid_configs(space("full"), H200, problem)[:6])])


def test_a_replay_tunes_on_the_model_gemms_it_holds_and_says_when_it_holds_none(tmp_path, ckpt, tiny, capsys):
    source = tmp_path / "source.sqlite"
    _store(source, GemmProblem(64, 1024, 1024))  # rows of H200, none of them the model's
    with pytest.raises(FinetuneError, match=r"no rows of H200-SXM-141GB for any of tiny's 14 distinct GEMMs "
                                            r"\(tokens 1,16\): a replay only answers from stored measurements"):
        run(_args(tmp_path, ckpt, tiny, replay=str(source), snapshot=False))
    held = expand(str(tiny), "1,16", "bf16").problems[5]
    _store(source, held)
    card = run(_args(tmp_path, ckpt, tiny, replay=str(source), snapshot=False, db=str(tmp_path / "r.sqlite"),
                     output=str(tmp_path / "r")))
    assert card["problems"] == [held.key] and card["spent_measurements"] == 4
    assert "the replay holds rows of 1 of tiny's 14 distinct GEMMs" in capsys.readouterr().err


def test_dtype_sets_the_model_gemms_dtype_and_needs_a_model(tmp_path, ckpt, tiny, capsys, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)  # the fake runner stands in for the H200
    card = run(_args(tmp_path, ckpt, tiny, dtype="fp16"))
    assert card["problems"] and all(key.split("_")[1] == "fp16" for key in card["problems"])
    assert json.loads((tmp_path / "out" / "h200.finetune.json").read_text())["plan"]["dtype"] == "fp16"
    with pytest.raises(FinetuneError, match="belongs to a run with"):  # the bf16 GEMMs are another run
        run(_args(tmp_path, ckpt, tiny))
    with pytest.raises(ValueError, match="--dtype sets the dtype of --model's GEMMs"):
        FinetuneArgs(gpu="h200", dtype="fp16")
    with pytest.raises(SystemExit):
        parse(["finetune", "--gpu", "h200", "--model", "gpt2", "--dtype", "int8"])
    assert "argument --dtype" in capsys.readouterr().err
