"""gnn-policy sweep with fake runners: dense, refined to a local optimum, confirmed, resumed."""
import dataclasses

import hardware_specs
from gnn_policy.baselines import ANALYTIC, analytic_pick, default_pick, fits
from gnn_policy.collect import select_problems
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.measure.simulator import load_fitted
from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy
from gnn_policy.space import TileConfig, space
from gnn_policy.sweep import SweepArgs, neighbours, refinement, run, top_configs

H200 = hardware_specs.load("h200")


def test_neighbours_differ_in_exactly_one_knob():
    s = space("full")
    c = TileConfig(64, 64, 32, 1, 8, 4, 3, "ptr")
    found = neighbours(c, s)
    assert len(found) == len(set(found)) == sum(len(v) - 1 for _, v in s.knobs)
    assert all(sum(getattr(n, k) != getattr(c, k) for k, _ in s.knobs) == 1 for n in found)


def test_top_configs_leave_cublas_out_and_break_ties_by_key():
    assert top_configs({"b": 2.0, "a": 2.0, "c": 1.0, CUBLAS: 9.0}, 2) == ["a", "b"]


def test_sweep_measures_densely_refines_to_a_local_optimum_confirms_and_resumes(tmp_path):
    args = SweepArgs(db=str(tmp_path / "m.sqlite"), gpu="h200", problems=2, configs=80, named=("triton_tutorial",),
                     top=2, runner="fake_runner:analytic", timeout=30, shard_dir=str(tmp_path / "shards"),
                     policy=(str(DEFAULT_CHECKPOINT),), policy_top=4)
    first = run(args)
    assert first["complete"] and first["refine_rounds"] >= 1 and first["confirm_problems_done"] == 2
    assert {p.name.split("_")[1] for p in (tmp_path / "shards").iterdir()} == {"sweep", "retime"}
    problems = select_problems("random-test", 2, 0)
    policy = Policy.load(DEFAULT_CHECKPOINT)
    with Database(args.db) as db:
        for p in problems:
            figures = db.tflops("H200-SXM-141GB", p.key)
            ok = fits(space("full"), H200, p)
            assert CUBLAS in figures and len(figures) > 80 + 1
            for baseline in (default_pick(p, H200, ok), analytic_pick(p, H200, space("full"), load_fitted(ANALYTIC))):
                assert baseline.key in figures
            picks = [pick.config.key for pick in policy.top_k(p, H200, 4)]
            assert len(picks) == 4 and all(k in figures for k in picks)
            best = TileConfig.from_key(top_configs(figures, 1)[0])
            near = [n.key for n in neighbours(best, space("full")) if ok(n)]
            assert all(k in figures for k in near) and max(figures[k] for k in near) <= figures[best.key]
        assert refinement(db, H200, problems, space("full"), 2) == []
    again = run(args)
    assert again["complete"] and again.get("measured", 0) == 0 and "confirm_problems_done" not in again
    # a policy added to a finished sweep gets its picks measured on every problem, finished ones too
    added = "checkpoints/pretrained-family.pt"
    more = run(dataclasses.replace(args, policy=(*args.policy, added)))
    family = Policy.load(added)
    with Database(args.db) as db:
        for p in problems:
            figures = db.tflops("H200-SXM-141GB", p.key)
            assert all(pick.config.key in figures for pick in family.top_k(p, H200, 4))
    assert more["measured"] > 0
