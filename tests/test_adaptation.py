"""The fine-tune's adaptation and its guard: what each strategy moves, and the cross-fit over the tuning
problems that keeps only adaptations that pick better."""
import dataclasses
import math
import random

import pytest
import torch

import hardware_specs
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.policy import Policy
from gnn_policy.space import space
from graphs import GemmProblem
from training import adaptation
from training.adaptation import CALIBRATION, AdaptPlan, Adapter
from training.guard import CheckResult, calibrated_only, cross_fit, pick_fraction

WHOLE = AdaptPlan("whole", steps=20)

H200 = hardware_specs.load("h200")
PROBLEMS = [GemmProblem(m=m, n=1024, k=512) for m in (16, 64, 256, 1024)]


@pytest.fixture()
def policy():
    torch.manual_seed(0)
    return Policy(PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,))))


def _db(tmp_path, per_problem: dict[int, int]):
    """Problem i gets per_problem[i] correct configs with distinct TFLOP/s."""
    configs = [c for c in space("full").valid(H200, "bf16", 512) if c.split_k == 1][:40]
    rng = random.Random(0)
    db = Database(tmp_path / "m.sqlite")
    rows = []
    for i, p in enumerate(PROBLEMS):
        for c in rng.sample(configs, per_problem.get(i, 0)):
            rows.append((Measurement(H200.name, p.key, c.key, "ok", median_ms=1.0, tflops=rng.uniform(10, 500)), p, c))
    db.add(rows)
    return db


def test_a_pick_is_judged_among_two_or_more_correct_configs(tmp_path, policy):
    with _db(tmp_path, {0: 1, 1: 6}) as db:
        assert pick_fraction(policy, PROBLEMS[0], H200, db.tflops(H200.name, PROBLEMS[0].key)) is None
        figures = db.tflops(H200.name, PROBLEMS[1].key)
        got = pick_fraction(policy, PROBLEMS[1], H200, figures)
    assert got in {v / max(figures.values()) for v in figures.values()}


def _oracle(cost_of):
    """An `adapt` that makes the copy's cost head read the true TFLOP/s of each held-out config."""
    def adapt(copy_, learn, spec, db, source, measured, optimiser, steps, norms):
        seen.append(([p.key for p in learn], steps))
        true = {}
        for p in PROBLEMS:
            for key, v in db.tflops(spec.name, p.key, source).items():
                true[(p.key, key)] = v

        def cost(h, problem, gpu, idx):
            keys = [copy_.model.space.at(tuple(row)).key for row in idx[0].tolist()]
            return torch.tensor([[100 * math.log(true[(problem.key, k)]) for k in keys]])
        copy_.cost = cost if cost_of == "truth" else copy_.cost
    seen: list = []
    return adapt, seen


@pytest.mark.parametrize("folds, learned", [(2, [[1, 3], [0, 2]]), (4, [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])])
def test_an_adaptation_that_picks_better_on_held_out_problems_is_kept(tmp_path, policy, monkeypatch, folds, learned):
    fake, seen = _oracle("truth")
    monkeypatch.setattr(adaptation, "adapt", fake)
    with _db(tmp_path, {i: 12 for i in range(4)}) as db:
        result = cross_fit(policy, PROBLEMS, H200, db, "real", WHOLE, rounds=1, seed=0, folds=folds)
    assert result.scored == 4 and result.adapted == pytest.approx(1.0)
    assert result.start < 1.0 and result.keep_adapted  # a random start misses the best of 12 somewhere
    # each copy learns from the other folds and is judged on its own
    assert seen == [([PROBLEMS[i].key for i in learn], 20) for learn in learned]


def test_an_adaptation_that_changes_nothing_or_cannot_be_judged_falls_back_to_the_start(tmp_path, policy, monkeypatch):
    fake, _ = _oracle("unchanged")
    monkeypatch.setattr(adaptation, "adapt", fake)
    with _db(tmp_path, {i: 12 for i in range(4)}) as db:
        tie = cross_fit(policy, PROBLEMS, H200, db, "real", WHOLE, rounds=1, seed=0)
    assert tie.adapted == tie.start and not tie.keep_adapted
    (tmp_path / "one").mkdir()
    with _db(tmp_path / "one", {i: 1 for i in range(4)}) as db:
        blind = cross_fit(policy, PROBLEMS, H200, db, "real", WHOLE, rounds=1, seed=0)
    assert blind == CheckResult(None, None, 0) and not blind.keep_adapted


def test_the_real_adaptation_moves_only_the_copy_and_gives_the_same_answer_twice(tmp_path, policy, monkeypatch):
    real, copies = adaptation.adapt, []

    def recording(copy_, *args):
        real(copy_, *args)
        copies.append({k: v.clone() for k, v in copy_.model.state_dict().items()})
    monkeypatch.setattr(adaptation, "adapt", recording)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with _db(tmp_path, {i: 8 for i in range(4)}) as db:
        rng = torch.random.get_rng_state()
        fast = AdaptPlan("whole", steps=3, lr=1e-2)
        first = cross_fit(policy, PROBLEMS, H200, db, "real", fast, rounds=1, seed=0)
        assert torch.equal(torch.random.get_rng_state(), rng)  # the caller's random stream is left alone
        torch.rand(5)  # whatever ran before, the answer is the same
        second = cross_fit(policy, PROBLEMS, H200, db, "real", fast, rounds=1, seed=0)
        third = cross_fit(policy, PROBLEMS, H200, db, "real", fast, rounds=1, seed=1)
    assert first == second and first.scored == 4
    # the copies' weights, not only the picks: the GPU dropout of training is seeded
    assert all(torch.equal(a[k], b[k]) for a, b in zip(copies[:2], copies[2:4]) for k in a)
    assert not all(torch.equal(a[k], b[k]) for a, b in zip(copies[:2], copies[4:]) for k in a)  # another seed differs
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert first.adapted != first.start and third.scored == 4  # lr 1e-2 moves the picks


def test_the_replay_table_scores_a_guarded_run_by_the_weights_it_keeps_and_counts_wrong_calls():
    from training.guard_replay import summarise

    def run_(top1, keep):
        return {"checkpoint": "checkpoints/meta.pt", "budget": 16, "seed": 0, "top1": top1, "best_of_8": top1 + 0.05,
                "verdicts": {"2": {"keep_adapted": keep}}}
    starts = {"checkpoints/meta.pt": {"top1": 0.8, "best_of_8": 0.9}}
    runs = [run_(0.9, True), run_(0.7, True), run_(0.9, False), run_(0.7, False)]
    row = summarise(runs, starts, [2]).splitlines()[-1]
    # kept: 0.9 and 0.7; dropped: the start's 0.8 twice. Wrong: keeping 0.7 and dropping 0.9
    assert row == "| meta | 16 | 0.800 / 0.850 (0.700-0.900) | 0.800 / 0.875, 2 of 4, 2 |"


@pytest.fixture()
def bounded():
    """A bounded (cost_model 1) policy that has a learned embedding for another GPU, so the H200
    reads the unknown GPU's row, as a held-out GPU does."""
    torch.manual_seed(0)
    return Policy(PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=("A100-SXM4-80GB",), cost_model=1)))


def test_calibration_moves_only_the_held_out_gpus_embedding_row_and_the_cost_heads_last_layer(tmp_path, bounded):
    before = {k: v.clone() for k, v in bounded.model.state_dict().items()}
    norms: dict = {}
    with _db(tmp_path, {i: 8 for i in range(4)}) as db:
        Adapter(bounded, AdaptPlan("calibrate", calibration_steps=5, calibration_lr=1e-2)).round(
            PROBLEMS, H200, db, "real", {}, norms)
    after = bounded.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved == set(CALIBRATION) and len(norms["calibration"]) == 5
    assert not torch.equal(before["gpu_embed.weight"][0], after["gpu_embed.weight"][0])  # the unknown GPU's row
    assert torch.equal(before["gpu_embed.weight"][1], after["gpu_embed.weight"][1])  # the A100's stays
    assert all(p.requires_grad for p in bounded.model.parameters())  # the frozen weights are trainable again


def test_every_weight_moves_under_the_whole_strategy_and_both_under_calibrate_whole(tmp_path, bounded, monkeypatch):
    stages = []
    for name in ("calibrate", "adapt"):
        monkeypatch.setattr(adaptation, name, lambda *a, name=name: stages.append((name, a[-2])))
    with _db(tmp_path, {i: 8 for i in range(4)}) as db:
        for strategy in ("whole", "calibrate", "calibrate-whole"):
            Adapter(bounded, AdaptPlan(strategy, steps=3, calibration_steps=7)).round(PROBLEMS, H200, db, "real", {}, {})
    assert stages == [("adapt", 3), ("calibrate", 7), ("calibrate", 7), ("adapt", 3)]
    with pytest.raises(ValueError, match="one of whole, calibrate, calibrate-whole"):
        AdaptPlan("everything")


def _judged_stages(monkeypatch, calibrate_to: str, adapt_to: str):
    """Fake stages that make the copy's cost head read the truth or its opposite on every problem."""
    def steer(copy_, db, spec, sign):
        true = {(p.key, k): v for p in PROBLEMS for k, v in db.tflops(spec.name, p.key, "real").items()}

        def predicted(problem, gpu, idx):
            keys = [copy_.model.space.at(tuple(row)).key for row in idx[0].tolist()]
            return torch.tensor([[sign * math.log(true[(problem.key, k)]) for k in keys]])
        copy_.predicted = predicted  # what the guard's picks read
    sign = {"truth": 1.0, "opposite": -1.0}
    monkeypatch.setattr(adaptation, "calibrate", lambda copy_, learn, spec, db, *a: steer(copy_, db, spec, sign[calibrate_to]))
    monkeypatch.setattr(adaptation, "adapt", lambda copy_, learn, spec, db, *a: steer(copy_, db, spec, sign[adapt_to]))


def test_the_guard_rejects_an_adaptation_that_picks_worse_on_the_held_out_folds(tmp_path, bounded, monkeypatch):
    _judged_stages(monkeypatch, "truth", "opposite")
    with _db(tmp_path, {i: 12 for i in range(4)}) as db:
        worse = cross_fit(bounded, PROBLEMS, H200, db, "real", WHOLE, rounds=1, seed=0)
        staged = cross_fit(bounded, PROBLEMS, H200, db, "real", AdaptPlan("calibrate-whole"), rounds=1, seed=0)
    assert worse.adapted < worse.start and worse.kept == "start" and worse.calibrated is None
    # the calibration picks the best measured config everywhere; the whole network's steps undo it
    assert staged.calibrated == pytest.approx(1.0) and staged.adapted < staged.start and staged.kept == "calibrated"


def test_the_calibration_a_guard_falls_back_to_is_fitted_from_the_start_on_every_measurement(tmp_path, bounded):
    before = {k: v.clone() for k, v in bounded.model.state_dict().items()}
    with _db(tmp_path, {i: 8 for i in range(4)}) as db:
        plan = AdaptPlan("calibrate-whole", calibration_steps=2, calibration_lr=1e-2)
        one = calibrated_only(bounded, PROBLEMS, H200, db, "real", plan, rounds=2, seed=0)
        two = calibrated_only(bounded, PROBLEMS, H200, db, "real", plan, rounds=2, seed=0)
    after = one.model.state_dict()
    assert {k for k in before if not torch.equal(before[k], after[k])} == set(CALIBRATION)
    assert all(torch.equal(after[k], two.model.state_dict()[k]) for k in after)  # seeded: the same weights twice
    assert all(torch.equal(before[k], v) for k, v in bounded.model.state_dict().items())  # the start is untouched


def test_a_stage_that_loses_on_one_fold_is_kept_only_where_the_pooled_score_alone_decides():
    folds = ({"start": 0.9, "calibrated": 0.95, "adapted": 0.99}, {"start": 0.9, "calibrated": 0.92, "adapted": 0.85})
    pooled = CheckResult(0.9, 0.92, 8, calibrated=0.935, folds=folds, every_fold=False)
    assert pooled.kept == "calibrated"  # the adapted 0.92 does not beat the calibration's 0.935
    gain_everywhere = dataclasses.replace(pooled, adapted=0.94)
    assert gain_everywhere.kept == "adapted"
    # under every_fold the adapted copies lose on the second fold (0.85 < 0.92), so the calibration stays
    assert dataclasses.replace(gain_everywhere, every_fold=True).kept == "calibrated"
    assert CheckResult(None, None, 0, every_fold=True).kept == "start"


def test_the_rank_signal_keeps_the_stage_that_orders_the_most_held_out_pairs():
    ranks = {"start": 0.70, "calibrated": 0.74, "adapted": 0.72}
    by_rank = CheckResult(0.9, 0.95, 8, calibrated=0.93, ranks=ranks, signal="rank")
    assert by_rank.kept == "calibrated"  # the picks would keep the adapted copies; the pairs say otherwise
    assert dataclasses.replace(by_rank, signal="pick").kept == "adapted"
    assert dataclasses.replace(by_rank, ranks={"start": 0.7, "adapted": 0.7}).kept == "start"  # a tie keeps the start
    assert CheckResult(None, None, 0, signal="rank").kept == "start"


def test_the_cross_fit_counts_held_out_pairs_each_stage_orders_as_measured(tmp_path, bounded, monkeypatch):
    _judged_stages(monkeypatch, "truth", "opposite")
    with _db(tmp_path, {i: 12 for i in range(4)}) as db:
        staged = cross_fit(bounded, PROBLEMS, H200, db, "real", AdaptPlan("calibrate-whole"), rounds=1, seed=0,
                           rank=True)
    # steered to the truth, the calibration orders every compared pair; reversed, the adapted copies none
    assert staged.ranks["calibrated"] == 1.0 and staged.ranks["adapted"] == 0.0 and 0 < staged.ranks["start"] < 1
    assert dataclasses.replace(staged, signal="rank").kept == "calibrated"
