"""An ensemble of policies (`Policy.members`, `gnn-policy ensemble`): the vote, the bound, the file."""
import copy

import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.checkpoint import CheckpointError
from gnn_policy.cli import main
from gnn_policy.cost_features import problem_vector
from gnn_policy.model import LOG_ROOF, ModelConfig, PolicyModel, bound_dims
from gnn_policy.policy import VOTE, Policy, save_checkpoint
from training.ensemble import EnsembleArgs, EnsembleError, run

H200 = hardware_specs.load("h200")
PROBLEMS = [GemmProblem(77, 1000, 333, activation="gelu"), GemmProblem(3000, 8192, 8192, b_layout="col", bias=True),
            GemmProblem(16, 4096, 4096, batch=4, dtype="fp16", residual=True)]


def _models(n: int, **cfg) -> list[PolicyModel]:
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(H200.name,), cost_model=1,
                                           floored_bound=True, **cfg)).eval())
    return out


def _member_costs(model: PolicyModel, policy: Policy, problem, flat: torch.Tensor) -> torch.Tensor:
    knobs = torch.stack(torch.unravel_index(flat, model.space.shape), -1)[None]
    graph, spec, index, _ = policy.features(problem, H200)
    with torch.no_grad():
        return model.cost(model.encode(graph, spec, index), knobs, problem_vector(problem, H200)[None])[0]


@pytest.mark.parametrize("problem", PROBLEMS, ids=["odd", "aligned", "batched"])
def test_an_ensemble_of_copies_scores_as_its_one_model(problem):
    model = _models(1)[0]
    single, twins = Policy(model), Policy(model, [copy.deepcopy(model), copy.deepcopy(model)])
    a, b = single.scores(problem, H200), twins.scores(problem, H200)
    valid = torch.isfinite(a.by_flat)
    assert torch.equal(valid, torch.isfinite(b.by_flat))
    assert torch.allclose(a.by_flat[valid], b.by_flat[valid], atol=1e-5)
    assert [p.config for p in single.top_k(problem, H200, 8)] == [p.config for p in twins.top_k(problem, H200, 8)]


@pytest.mark.parametrize("problem", PROBLEMS, ids=["odd", "aligned", "batched"])
def test_the_head_is_the_members_mean_and_nothing_is_above_the_roofline(problem):
    first, *others = _models(3)
    single, ensemble = Policy(first), Policy(first, others)
    own = single.scores(problem, H200).by_flat
    n_valid = int(torch.isfinite(own).sum())
    vote = own.topk(min(VOTE, n_valid)).indices  # the first member's VOTE best configs
    mean = torch.stack([_member_costs(m, ensemble, problem, vote) for m in (first, *others)]).mean(0)
    s = ensemble.scores(problem, H200)
    assert torch.allclose(s.by_flat[vote], mean, atol=1e-5)
    roof = bound_dims(first.cfg, problem_vector(problem, H200)).float()[LOG_ROOF]
    if n_valid > VOTE:  # outside the vote: the first member's score moved by one shared shift (or capped)
        rest = torch.isfinite(own) & ~torch.isin(torch.arange(len(own)), vote) & (s.by_flat < roof - 1e-6)
        moved = (s.by_flat - own)[rest]
        assert len(moved) and float(moved.max() - moved.min()) < 1e-4
    valid = torch.isfinite(s.by_flat)
    assert torch.equal(valid, torch.isfinite(own))  # the same configs valid, none lost
    assert float(s.by_flat[valid].max()) <= float(roof) + 1e-6
    # the first pick is the best of the vote, and the distribution is one over the valid configs
    assert ensemble.top_k(problem, H200, 1)[0].config == ensemble.model.space.points[int(s.by_flat.argmax())]
    total = s.log_prob(s.by_flat[valid].double()).exp().sum()
    assert abs(float(total) - 1.0) < 1e-5  # log_z is a float32 logsumexp


def test_an_ensemble_round_trips_through_its_file_and_the_cli(tmp_path, capsys):
    models = _models(3)
    paths = []
    for i, m in enumerate(models):
        paths.append(tmp_path / f"s{i}.pt")
        save_checkpoint(m, paths[-1])
    (tmp_path / "s0.card.json").write_text('{"checkpoint": "s0.pt", "job": "pretrain", "args": {"seed": 0}}')
    out = tmp_path / "ens.pt"
    argv = ["ensemble", "--out", str(out)] + [a for p in paths for a in ("--member", str(p))]
    assert main(argv) == 0
    assert "ensemble of 3 written" in capsys.readouterr().out
    loaded = Policy.load(out)
    assert len(loaded.members) == 2
    for a, b in zip([loaded.model, *loaded.members], models):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    in_memory = Policy(models[0], models[1:])
    for problem in PROBLEMS:
        assert loaded.top_k(problem, H200, 4) == in_memory.top_k(problem, H200, 4)
    card = (tmp_path / "ens.card.json").read_text()
    assert '"job": "ensemble"' in card and '"seed": 0' in card and '"checkpoint": "s2.pt"' in card
    assert loaded.first().members == () and loaded.first().model is loaded.model


def test_members_that_cannot_make_one_ensemble_are_refused_by_name(tmp_path):
    a, b = _models(2)
    wide = _models(1, knob_embed=8)[0]
    for name, m in (("a", a), ("b", b), ("wide", wide)):
        save_checkpoint(m, tmp_path / f"{name}.pt")
    save_checkpoint(a, tmp_path / "ens.pt", [b])
    p = lambda name: str(tmp_path / f"{name}.pt")  # noqa: E731
    with pytest.raises(EnsembleError, match="at least two"):
        run(EnsembleArgs(out=p("x"), member=(p("a"),)))
    with pytest.raises(EnsembleError, match=r"wide.pt: its model config differs .* in knob_embed"):
        run(EnsembleArgs(out=p("x"), member=(p("a"), p("wide"))))
    with pytest.raises(EnsembleError, match="is one of the members"):
        run(EnsembleArgs(out=p("a"), member=(p("a"), p("b"))))
    with pytest.raises(EnsembleError, match="ens.pt is an ensemble already"):
        run(EnsembleArgs(out=p("x"), member=(p("a"), p("ens"))))
    assert not (tmp_path / "x.pt").exists()
    with pytest.raises(ValueError, match="share the first member's ModelConfig"):
        Policy(a, [wide])


def test_a_checkpoint_with_broken_members_is_one_checkpoint_error(tmp_path):
    a, b = _models(2)
    state = {"model_config": {**a.cfg.__dict__}, "state_dict": a.state_dict()}
    for members, fault in (({"x": 1}, "not a list of state dicts"), ([{"cost_head.0.weight": torch.zeros(1)}],
                                                                     "member 1's weights do not fit")):
        path = tmp_path / "bad.pt"
        torch.save({**state, "members": members}, path)
        with pytest.raises(CheckpointError, match=fault):
            Policy.load(path)


@pytest.mark.parametrize("problem", PROBLEMS, ids=["odd", "aligned", "batched"])
def test_scoring_some_configs_gives_what_scoring_all_gives(problem):
    from gnn_policy.scoring import config_table, score_all, score_some

    model = _models(1)[0]
    policy = Policy(model)
    graph, spec, index, mask = policy.features(problem, H200)
    dims = problem_vector(problem, H200)
    table = config_table(model, model.space.mask(H200, problem.dtype), dims)
    with torch.no_grad():
        h = model.encode(graph, spec, index)
    flat, pred = score_all(model, table, h, dims, mask[0])
    pick = torch.randperm(len(flat), generator=torch.Generator().manual_seed(0))[:3000]
    assert torch.allclose(score_some(model, table, h, dims, flat[pick]), pred[pick], atol=1e-6)
    outside = torch.nonzero(table.position < 0).flatten()[:1]
    with pytest.raises(ValueError, match="not in this ConfigTable"):
        score_some(model, table, h, dims, torch.cat([flat[:2], outside]))
