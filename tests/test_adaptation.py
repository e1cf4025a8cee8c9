"""The fine-tune's guard: the cross-fit over the tuning problems keeps only adaptations that pick better."""
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
from training.adaptation import CheckResult, cross_fit, pick_fraction

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
        result = cross_fit(policy, PROBLEMS, H200, db, "real", steps=20, lr=3e-4, seed=0, folds=folds)
    assert result.scored == 4 and result.adapted == pytest.approx(1.0)
    assert result.start < 1.0 and result.keep_adapted  # a random start misses the best of 12 somewhere
    # each copy learns from the other folds and is judged on its own
    assert seen == [([PROBLEMS[i].key for i in learn], 20) for learn in learned]


def test_an_adaptation_that_changes_nothing_or_cannot_be_judged_falls_back_to_the_start(tmp_path, policy, monkeypatch):
    fake, _ = _oracle("unchanged")
    monkeypatch.setattr(adaptation, "adapt", fake)
    with _db(tmp_path, {i: 12 for i in range(4)}) as db:
        tie = cross_fit(policy, PROBLEMS, H200, db, "real", steps=20, lr=3e-4, seed=0)
    assert tie.adapted == tie.start and not tie.keep_adapted
    (tmp_path / "one").mkdir()
    with _db(tmp_path / "one", {i: 1 for i in range(4)}) as db:
        blind = cross_fit(policy, PROBLEMS, H200, db, "real", steps=20, lr=3e-4, seed=0)
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
        first = cross_fit(policy, PROBLEMS, H200, db, "real", steps=3, lr=1e-2, seed=0)
        assert torch.equal(torch.random.get_rng_state(), rng)  # the caller's random stream is left alone
        torch.rand(5)  # whatever ran before, the answer is the same
        second = cross_fit(policy, PROBLEMS, H200, db, "real", steps=3, lr=1e-2, seed=0)
        third = cross_fit(policy, PROBLEMS, H200, db, "real", steps=3, lr=1e-2, seed=1)
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
