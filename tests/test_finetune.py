"""gnn-policy finetune: it never overspends, refuses a GPU it is not on, resumes, and adapts."""
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import hardware_specs
from gnn_policy.database import Database
from gnn_policy.interrupts import Interrupted
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import Policy
from training import adaptation, finetune, guard
from training.adaptation import CALIBRATION
from training.guard import CheckResult
from training.finetune import FinetuneArgs, FinetuneError, check_gpu, run
from training.finetune_budget import Budget

H200 = hardware_specs.load("h200")


@pytest.fixture()
def bounded_ckpt(tmp_path):
    """A bounded (cost_model 1) start with a learned embedding for another GPU: the H200 is new to it."""
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=("A100-SXM4-80GB",), cost_model=1))
    path = tmp_path / "bounded.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return path


def _args(tmp_path, ckpt, **kw):
    base = dict(gpu="h200", budget="16", db=str(tmp_path / "m.sqlite"), checkpoint=str(ckpt),
                output=str(tmp_path / "out"), problems=3, rounds=2, steps=2, runner="fake_runner:measure",
                wandb=False)
    return FinetuneArgs(**{**base, **kw})


def _rows(tmp_path, source="real"):
    with Database(tmp_path / "m.sqlite") as db:
        return db.conn.execute("SELECT COUNT(*) FROM measurements WHERE source=?", (source,)).fetchone()[0]


def _kill_at_call(monkeypatch, name: str, n: int, module=finetune):
    """Make module.<name> raise KeyboardInterrupt (a kill) on its n-th call; returns the original.
    The run reports it as `Interrupted`, with what it stored."""
    real, calls = getattr(module, name), []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, dying)
    return real


def test_budgets_parse_and_bad_ones_are_refused():
    assert Budget.parse("64").count == 64 and Budget.parse("10m").seconds == 600 and Budget.parse("90s").seconds == 90
    with pytest.raises(FinetuneError, match="number of measurements"):
        Budget.parse("lots")


def test_a_count_budget_is_spent_exactly_never_more(tmp_path, ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)  # the fake runner stands in for the H200
    card = run(_args(tmp_path, ckpt, budget="13"))
    assert card["spent_measurements"] == 13 == _rows(tmp_path)
    assert (tmp_path / "out" / "h200.pt").exists() and card["grad_norm_mean"]["calibration"] > 0  # the default
    assert run(_args(tmp_path, ckpt, budget="13"))["grad_norm_mean"] == card["grad_norm_mean"]  # a re-run's card
    whole = run(_args(tmp_path, ckpt, budget="13", strategy="whole", output=str(tmp_path / "w"),
                      db=str(tmp_path / "w.sqlite")))
    assert whole["grad_norm_mean"]["supervised"] > 0 and "calibration" not in whole["grad_norm_mean"]


def test_no_snapshot_refuses_a_database_with_earlier_rows_of_the_gpu(tmp_path, ckpt):
    run(_args(tmp_path, ckpt, gpu="h100", simulate=True, budget="2", rounds=1, output=str(tmp_path / "a")))
    with pytest.raises(FinetuneError, match="--no-snapshot: .* already holds 2 simulated rows of H100-SXM5-80GB"):
        run(_args(tmp_path, ckpt, gpu="h100", simulate=True, budget="2", rounds=1, snapshot=False,
                  output=str(tmp_path / "b")))


def test_the_wrong_gpu_is_refused_with_a_way_out():
    with pytest.raises(FinetuneError, match="does not match this machine's H200-SXM-141GB.*--simulate"):
        check_gpu(hardware_specs.load("h100"), H200, simulate=False)
    check_gpu(hardware_specs.load("h200-sm64"), H200, simulate=False)  # a slice of the local GPU is fine
    check_gpu(hardware_specs.load("h100"), H200, simulate=True)
    with pytest.raises(FinetuneError, match="no CUDA GPU here"):
        check_gpu(H200, None, simulate=False)


def test_the_cli_refuses_h100_without_a_gpu_and_runs_it_simulated(tmp_path, ckpt):
    cmd = [sys.executable, "-m", "gnn_policy.cli", "finetune", "--gpu", "h100", "--budget", "6", "--problems", "2",
           "--rounds", "2", "--steps", "1", "--db", str(tmp_path / "m.sqlite"), "--checkpoint", str(ckpt),
           "--output", str(tmp_path / "out")]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--simulate" in refused.stderr
    logs = tmp_path / "runs"
    ran = subprocess.run(cmd + ["--simulate", "--log-dir", str(logs), "--tags", "method=plain", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    record = b"".join(f.read_bytes() for f in logs.glob("wandb/offline-run-*/run-*.wandb"))
    assert b"transfer-H100-SXM5-80GB" in record and b"method=plain" in record  # group and tags, offline
    again = subprocess.run(cmd + ["--simulate", "--log-dir", str(logs), "--tags", "method=plain"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and len(list(logs.glob("wandb/offline-run-*"))) == 1  # finished: no second run
    assert "no measured winners are kept (a simulated run measures nothing real)" in again.stdout  # the table
    assert json.loads(ran.stdout)["spent_measurements"] == 6 == _rows(tmp_path, "simulated")
    assert _rows(tmp_path, "real") == 0  # simulated rows never pass as real
    assert (tmp_path / "out" / "h100.simulated.pt").exists() and not (tmp_path / "out" / "h100.pt").exists()


def test_an_interrupted_run_resumes_without_spending_twice(tmp_path, ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    real_adapt = _kill_at_call(monkeypatch, "calibrate", 2, adaptation)  # after round 2's measurements, before its adaptation
    with pytest.raises(Interrupted, match="run the same command again to resume"):
        run(_args(tmp_path, ckpt, budget="12", rounds=3))
    spent_before = _rows(tmp_path)
    assert 0 < spent_before <= 12
    out = tmp_path / "out"  # a stopped run leaves its rounds' weights, and nothing that looks like a result
    assert (out / "h200.rounds.pt").exists() and not (out / "h200.pt").exists() and not (out / "h200.card.json").exists()
    monkeypatch.setattr(adaptation, "calibrate", real_adapt)
    original, loaded = Policy.load.__func__, []
    monkeypatch.setattr(Policy, "load", classmethod(lambda cls, path: (loaded.append(str(path)), original(cls, path))[1]))
    card = run(_args(tmp_path, ckpt, budget="12", rounds=3))
    # the start, checked before anything is written; then round 1's adapted weights, which the run goes on from
    assert loaded[:2] == [str(ckpt), str(out / "h200.rounds.pt")]
    assert loaded[2:] == [str(ckpt)]  # the start, for the guard
    assert card["spent_measurements"] == 12 == _rows(tmp_path) and (out / "h200.pt").exists()
    again = run(_args(tmp_path, ckpt, budget="12", rounds=3))
    assert again["spent_measurements"] == 12 == _rows(tmp_path)  # finished: nothing more to spend


def test_a_stopped_time_budget_run_resumes_with_the_seconds_already_spent(tmp_path, ckpt, monkeypatch):
    real_adapt = _kill_at_call(monkeypatch, "calibrate", 2, adaptation)  # after round 2's measurements
    args = _args(tmp_path, ckpt, gpu="h100", simulate=True, budget="30s", rounds=3)
    with pytest.raises(Interrupted):
        run(args)
    state_path = tmp_path / "out" / "h100.simulated.finetune.json"
    before = json.loads(state_path.read_text())["spent_seconds"]
    monkeypatch.setattr(adaptation, "calibrate", real_adapt)
    assert before > 0 and run(args)["spent_seconds"] >= round(before, 1)


def test_a_finished_time_budget_run_run_again_keeps_the_seconds_it_spent(tmp_path, ckpt):
    args = _args(tmp_path, ckpt, gpu="h100", simulate=True, budget="30s", rounds=2)
    card = run(args)
    state_path = tmp_path / "out" / "h100.simulated.finetune.json"
    spent = json.loads(state_path.read_text())["spent_seconds"]
    assert spent > 0 and card["spent_seconds"] == round(spent, 1)
    again = run(args)  # finished: nothing more is spent, and what was is not forgotten
    assert json.loads(state_path.read_text())["spent_seconds"] == spent and again["spent_seconds"] == round(spent, 1)


@pytest.mark.parametrize("verdict, kept", [(CheckResult(0.9, 0.7, 3), "start"), (CheckResult(0.7, 0.9, 3), "adapted"),
                                            (CheckResult(None, None, 0), "start")])
def test_the_guard_falls_back_to_the_start_unless_the_cross_fit_says_the_adaptation_picks_better(
        tmp_path, ckpt, monkeypatch, verdict, kept):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    calls = []
    monkeypatch.setattr(guard, "cross_fit", lambda *a, **k: (calls.append(a), verdict)[1])
    card = run(_args(tmp_path, ckpt, budget="12", lr=1e-2))
    start, final = (torch.load(p, weights_only=True)["state_dict"] for p in (ckpt, tmp_path / "out" / "h200.pt"))
    assert card["guard"]["kept"] == kept and card["guard"]["scored"] == verdict.scored
    assert all(torch.equal(start[k], final[k]) for k in start) == (kept == "start")
    assert run(_args(tmp_path, ckpt, budget="12", lr=1e-2))["guard"]["kept"] == kept and len(calls) == 1  # decided once
    unguarded = run(_args(tmp_path, ckpt, budget="12", lr=1e-2, guard=False, output=str(tmp_path / "raw"),
                          db=str(tmp_path / "raw.sqlite")))
    assert unguarded["guard"] is None and len(calls) == 1


def test_a_kill_right_after_a_measurement_is_not_spent_again(tmp_path, ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    real_save = _kill_at_call(monkeypatch, "_save_state", 3)  # the state write after the second batch
    with pytest.raises(Interrupted, match="run the same command again to resume"):
        run(_args(tmp_path, ckpt, budget="12"))
    monkeypatch.setattr(finetune, "_save_state", real_save)
    assert run(_args(tmp_path, ckpt, budget="12"))["spent_measurements"] == 12 == _rows(tmp_path)


def test_a_resume_with_other_settings_is_refused(tmp_path, ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    run(_args(tmp_path, ckpt, budget="6"))
    with pytest.raises(FinetuneError, match="belongs to a run with"):
        run(_args(tmp_path, ckpt, budget="8"))
    # a run killed under other losses is not finished under these
    monkeypatch.setattr(finetune, "ADAPT_VERSION", finetune.ADAPT_VERSION + 1)
    with pytest.raises(FinetuneError, match="belongs to a run with"):
        run(_args(tmp_path, ckpt, budget="6"))
    monkeypatch.undo()
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    # nor from another starting checkpoint saved under the same path
    torch.save({**torch.load(ckpt, weights_only=True), "note": "retrained"}, ckpt)
    with pytest.raises(FinetuneError, match="belongs to a run with"):
        run(_args(tmp_path, ckpt, budget="6"))


def test_a_start_that_is_the_output_or_missing_is_refused(tmp_path, ckpt):
    own = tmp_path / "out" / "h200.simulated.pt"  # what a simulated h200 run writes
    own.parent.mkdir()
    own.write_bytes(ckpt.read_bytes())
    with pytest.raises(FinetuneError, match="is the file this run writes"):
        run(_args(tmp_path, ckpt, checkpoint=str(own), simulate=True))
    with pytest.raises(FinetuneError, match="no policy checkpoint at"):
        run(_args(tmp_path, ckpt, checkpoint=str(tmp_path / "missing.pt"), simulate=True))


def test_a_time_budget_keeps_measuring_until_its_time_is_used(tmp_path, ckpt):
    short = run(_args(tmp_path, ckpt, gpu="h100", simulate=True, budget="0.001s", output=str(tmp_path / "a")))
    longer = run(_args(tmp_path, ckpt, gpu="h100", simulate=True, budget="3s", output=str(tmp_path / "b")))
    assert short["spent_measurements"] <= 2 * 3 * 2 < longer["spent_measurements"]


def _replay_source(tmp_path, problems: int = 3) -> str:
    """A database whose real H200 rows (the fake runner's) a replay answers from, tuning problems included."""
    from gnn_policy.collect import CollectArgs, run as collect

    path = str(tmp_path / "source.sqlite")
    collect(CollectArgs(db=path, gpu="h200", split="train", problems=problems, configs=12, runner="fake_runner:measure"))
    return path


def test_a_replay_spends_its_budget_on_stored_configs_and_copies_their_rows(tmp_path, ckpt):
    source = _replay_source(tmp_path)
    card = run(_args(tmp_path, ckpt, budget="10", replay=source, snapshot=False, runner="no.such:runner"))
    assert card["spent_measurements"] == 10 == _rows(tmp_path)  # no GPU, no runner: every row is a lookup
    query = ("SELECT p.key, c.key, m.tflops FROM measurements m JOIN problems p ON p.id=m.problem_id "
             "JOIN configs c ON c.id=m.config_id WHERE m.source='real'")
    with Database(source) as src, Database(tmp_path / "m.sqlite") as db:
        stored = {(p, c): tf for p, c, tf in src.conn.execute(query)}
        replayed = list(db.conn.execute(query))
    assert all(stored[p, c] == tf for p, c, tf in replayed)


def test_a_replay_tunes_on_problems_it_holds_and_is_refused_with_the_snapshot_or_none(tmp_path, ckpt):
    source = _replay_source(tmp_path, problems=1)
    with pytest.raises(FinetuneError, match="--replay answers from stored real rows: .* --no-snapshot"):
        run(_args(tmp_path, ckpt, replay=source))
    card = run(_args(tmp_path, ckpt, replay=source, snapshot=False, budget="4", seed=1))  # seed 1 draws others first
    with Database(source) as src:
        assert card["problems"] == [p.key for p in src.problems(H200.name)]
    with pytest.raises(FinetuneError, match=r"--replay .*source.sqlite has no rows of H200-SXM-141GB for val-split"):
        run(_args(tmp_path, ckpt, replay=source, snapshot=False, split="val", output=str(tmp_path / "v")))


def test_a_replay_answers_with_the_figure_best_known_uses_and_a_failure_only_without_one(tmp_path):
    from gnn_policy.measure.replay import ReplayPool
    from gnn_policy.measure.result import Measurement
    from gnn_policy.search import valid_configs
    from gnn_policy.space import TileConfig, space
    from graphs import GemmProblem

    problem = GemmProblem(64, 4096, 4096)
    a, b, c = valid_configs(space("full"), H200, problem)[:3]
    rows = [Measurement(H200.name, problem.key, a.key, "ok", median_ms=1.0, tflops=100.0, versions="v1"),
            Measurement(H200.name, problem.key, a.key, "crashed", versions="v2"),  # a later failure does not win
            Measurement(H200.name, problem.key, b.key, "ok", median_ms=2.0, tflops=50.0, versions="v1"),
            Measurement(H200.name, problem.key, b.key, "ok", median_ms=1.0, tflops=100.0, versions="v2"),
            Measurement(H200.name, problem.key, c.key, "timeout", versions="v1")]
    with Database(tmp_path / "s.sqlite") as db:
        db.add([(m, problem, cfg) for m, cfg in zip(rows, (a, a, b, b, c))])
        best = db.tflops(H200.name, problem.key)
    replayed = {m.config: m for m in ReplayPool(tmp_path / "s.sqlite", H200.name).run(problem, [a, b, c])}
    assert {k: replayed[k].tflops for k in (a.key, b.key)} == {a.key: best[a.key], b.key: best[b.key]} == \
        {a.key: 100.0, b.key: 100.0}
    assert replayed[c.key].status == "timeout" and replayed[c.key].tflops is None


def _moved(start_path, final_path) -> set[str]:
    start, final = (torch.load(p, weights_only=True)["state_dict"] for p in (start_path, final_path))
    return {k for k in start if not torch.equal(start[k], final[k])}


def test_a_calibration_fine_tune_round_trips_a_checkpoint_that_differs_from_the_start_in_the_calibration_alone(
        tmp_path, bounded_ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    card = run(_args(tmp_path, bounded_ckpt, budget="12", strategy="calibrate", calibration_lr=1e-2, guard=False))
    out = tmp_path / "out" / "h200.pt"
    assert card["args"]["strategy"] == "calibrate" and len(card["grad_norm_mean"]) == 1
    assert Policy.load(out).model.cfg == Policy.load(bounded_ckpt).model.cfg  # loads as the start's architecture
    assert _moved(bounded_ckpt, out) == set(CALIBRATION)


def test_a_guard_that_finds_only_the_calibration_helps_keeps_it_alone(tmp_path, bounded_ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    monkeypatch.setattr(guard, "cross_fit", lambda *a, **k: CheckResult(0.8, 0.7, 3, calibrated=0.9))
    card = run(_args(tmp_path, bounded_ckpt, budget="12", strategy="calibrate-whole", calibration_lr=1e-2))
    assert card["guard"]["kept"] == "calibrated"
    assert _moved(bounded_ckpt, tmp_path / "out" / "h200.pt") == set(CALIBRATION)  # the whole network's steps undone


def test_a_problems_measurements_take_turns_over_the_top_pick_the_doubt_and_a_neighbour_of_the_best(bounded_ckpt):
    import random

    from gnn_policy.search import valid_configs
    from gnn_policy.space import TileConfig, space
    from graphs import GemmProblem
    from training.finetune_measure import ENSEMBLE_TOP, _candidates, _ensemble

    policy, problem = Policy.load(bounded_ckpt), GemmProblem(64, 1024, 1024)
    offered = {c.key for c in valid_configs(space("full"), H200, problem)[:300]}
    configs = [TileConfig.from_key(k) for k in sorted(offered)]
    members = _ensemble(policy, problem, H200, configs)
    by_pred = members[0].argsort(descending=True).tolist()
    top = _candidates(policy, problem, H200, {}, 1, random.Random(0), offered)
    assert top == [configs[by_pred[0]]]  # nothing measured yet: the would-be first pick
    known = {top[0].key: 100.0}
    doubt = _candidates(policy, problem, H200, known, 1, random.Random(0), offered)[0]
    rest = [i for i in by_pred if configs[i].key not in known][:ENSEMBLE_TOP]
    spread = (members[:, rest] - members[:, rest].max(1, keepdim=True).values).std(0)
    assert doubt == configs[rest[int(spread.argmax())]]  # second: where the embeddings disagree most
    known[doubt.key] = 50.0
    near = _candidates(policy, problem, H200, known, 1, random.Random(0), offered)[0]
    index = policy.model.space.index
    assert sum(a != b for a, b in zip(index(near), index(top[0]))) == 1  # third: a neighbour of the best found


def test_stored_configs_outside_the_policys_space_neither_become_candidates_nor_seed_mutations(bounded_ckpt):
    import random

    from gnn_policy.search import valid_configs
    from gnn_policy.space import space
    from graphs import GemmProblem
    from training.finetune_measure import _candidates

    policy, problem = Policy.load(bounded_ckpt), GemmProblem(64, 1024, 1024)
    assert policy.model.space.name == "full"
    persistent = [c for c in valid_configs(space("hopper"), H200, problem) if c.variant == "persistent"][:20]
    ours = valid_configs(space("full"), H200, problem)[:100]
    assert persistent and all(c not in policy.model.space for c in persistent)
    offered = {c.key for c in persistent + ours}
    known = {persistent[0].key: 500.0, ours[0].key: 100.0}  # the best found is one the policy cannot score
    picked = _candidates(policy, problem, H200, known, 6, random.Random(0), offered)
    assert len(picked) == 6 and all(c in policy.model.space and c.key not in known for c in picked)


@pytest.fixture()
def ensemble_ckpt(tmp_path):
    """A vote of two bounded members of one config, different weights (as `gnn-policy ensemble` writes)."""
    from gnn_policy.policy import save_checkpoint

    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=("A100-SXM4-80GB",), cost_model=1)))
    save_checkpoint(models[0], tmp_path / "ens.pt", models[1:])
    return tmp_path / "ens.pt"


def _members_moved(start_path, final_path) -> list[set[str]]:
    start, final = (torch.load(p, weights_only=True) for p in (start_path, final_path))
    pairs = zip([start["state_dict"], *start["members"]], [final["state_dict"], *final["members"]])
    return [{k for k in a if not torch.equal(a[k], b[k])} for a, b in pairs]


def test_an_ensemble_fine_tune_adapts_every_member_and_writes_the_vote(tmp_path, ensemble_ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    run(_args(tmp_path, ensemble_ckpt, budget="12", strategy="calibrate", calibration_lr=1e-2, guard=False))
    out = tmp_path / "out" / "h200.pt"
    assert len(Policy.load(out).members) == 1
    assert _members_moved(ensemble_ckpt, out) == [set(CALIBRATION)] * 2


def test_a_guard_that_keeps_the_start_of_an_ensemble_keeps_all_of_it(tmp_path, ensemble_ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    monkeypatch.setattr(guard, "cross_fit", lambda *a, **k: CheckResult(0.9, 0.7, 3))
    card = run(_args(tmp_path, ensemble_ckpt, budget="12", strategy="calibrate", calibration_lr=1e-2))
    assert card["guard"]["kept"] == "start"
    assert _members_moved(ensemble_ckpt, tmp_path / "out" / "h200.pt") == [set(), set()]


def test_an_ensembles_picks_and_doubt_read_its_vote(ensemble_ckpt):
    from gnn_policy.search import valid_configs
    from gnn_policy.space import space
    from graphs import GemmProblem
    from training.finetune_measure import _ensemble
    from training.guard import first_choice

    vote, problem = Policy.load(ensemble_ckpt), GemmProblem(64, 1024, 1024)
    configs = valid_configs(space("full"), H200, problem)[:300]
    idx = torch.tensor([vote.model.space.index(c) for c in configs])[None]
    each = [Policy(m).predicted(problem, H200, idx)[0] for m in (vote.model, *vote.members)]
    mean = torch.stack(each).mean(0)
    assert not torch.equal(each[0].argmax(), each[1].argmax())  # the members disagree on their first pick
    assert first_choice(vote, problem, H200, configs) == int(mean.argmax())
    rows = _ensemble(vote, problem, H200, configs)
    assert torch.allclose(rows[0], mean) and torch.allclose(rows[1], each[0]) and torch.allclose(rows[2], each[1])
    assert len(rows) == 3 + len(vote.model.cfg.gpu_names)  # and the first member through its other embeddings


def test_a_replay_on_a_random_split_tunes_on_stored_problems_whatever_its_seed():
    from gnn_policy.collect import select_problems
    from training.tuning_problems import select

    drawn = select_problems("random-train", 40, 0)
    stored = {p.key for p in drawn[5::3]}  # a slice's sample of what the collections drew (seed 0's stream)
    picks = {seed: select("random-train", 4, seed, None, lambda p: p.key in stored)[0] for seed in range(3)}
    assert all(len(ps) == 4 and {p.key for p in ps} <= stored for ps in picks.values())
    assert len({tuple(p.key for p in ps) for ps in picks.values()}) > 1  # the seed chooses among them


def test_replayed_scoring_takes_the_first_measured_problems_and_says_when_there_are_none(tmp_path):
    from gnn_policy.collect import select_problems
    from training.adapt_replay import EVAL_PROBLEMS, evaluation_problems

    class Stored:  # a database that holds a best known for a few problems
        def __init__(self, keys):
            self.keys = keys

        def best_known(self, gpu, key):
            return ("cfg", 1.0) if key in self.keys else None

    drawn = select_problems("random-val", 2 * EVAL_PROBLEMS + 10, 0)
    db = Stored({p.key for p in drawn[1::2]})
    got = evaluation_problems(db, "H100-SXM5-80GB-sm64", {drawn[1].key}, "random-val")
    assert [p.key for p in got] == [p.key for p in drawn[3::2]][:EVAL_PROBLEMS]
    with pytest.raises(ValueError, match="no test problem has rows of H200-SXM-141GB-sm16"):
        evaluation_problems(Stored(set()), "H200-SXM-141GB-sm16", set(), "test")


def test_a_fine_tune_keeps_each_tuning_problems_best_measured_config_as_its_first_pick(tmp_path, bounded_ckpt,
                                                                                      monkeypatch):
    from graphs import GemmProblem
    from gnn_policy.measure.result import CUBLAS

    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    card = run(_args(tmp_path, bounded_ckpt, budget="12", strategy="calibrate"))
    tuned = Policy.load(tmp_path / "out" / "h200.pt")
    assert set(card["measured_winners"]) == set(card["problems"])
    with Database(tmp_path / "m.sqlite") as db:
        for key, win in card["measured_winners"].items():
            rows = {k: v for k, v in db.tflops(H200.name, key, "real").items() if k != CUBLAS}
            assert win["config"] == max(rows, key=rows.get)
            first = tuned.top_k(GemmProblem.from_key(key), H200, 2)[0]
            assert (first.config.key, first.measured) == (win["config"], True)
            assert first.predicted_tflops == pytest.approx(rows[win["config"]])
    # a simulated run measured nothing on a GPU: it keeps no winners
    sim = run(_args(tmp_path, bounded_ckpt, gpu="h100", simulate=True, budget="6", rounds=1, output=str(tmp_path / "s")))
    assert sim["measured_winners"] == {} and not Policy.load(tmp_path / "s" / "h100.simulated.pt").measured.get("H100-SXM5-80GB")


def test_a_budget_smaller_than_a_round_per_problem_still_reaches_every_problem(tmp_path, bounded_ckpt, monkeypatch):
    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    card = run(_args(tmp_path, bounded_ckpt, budget="16", problems=8, rounds=4, guard=False))
    with Database(tmp_path / "m.sqlite") as db:
        counts = [len(db.measured(H200.name, "real", problem=key)) for key in card["problems"]]
    assert len(counts) == 8 and counts == [2] * 8  # 4 a round over 8 problems: each twice, none left out


def test_every_tuning_problems_first_measurement_is_the_starts_pick_so_its_winner_is_never_below_it(
        tmp_path, bounded_ckpt, monkeypatch):
    from graphs import GemmProblem

    monkeypatch.setattr(finetune, "check_gpu", lambda *a: None)
    card = run(_args(tmp_path, bounded_ckpt, budget="8", problems=4, rounds=4, guard=False,
                     strategy="calibrate", calibration_lr=1e-1))  # a large step: later rounds pick otherwise
    start = Policy.load(bounded_ckpt)
    with Database(tmp_path / "m.sqlite") as db:
        for key, win in card["measured_winners"].items():
            rows = db.tflops(H200.name, key, "real")
            first = start.top_k(GemmProblem.from_key(key), H200, 1)[0].config.key
            assert first in rows and win["tflops"] >= rows[first]
