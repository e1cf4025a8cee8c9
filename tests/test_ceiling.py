"""The ceiling benchmark's plan and loop, run with the fake runner (no GPU)."""
import dataclasses
import json

import pytest

import hardware_specs
from gnn_policy.benchmarks import ceiling
from gnn_policy.database import Database
from gnn_policy.space import named_list, space, violations

H200 = hardware_specs.load("h200")


def test_shape_list_covers_the_categories_and_both_layouts():
    cats = {c for c, *_ in ceiling.SHAPES}
    assert len(ceiling.SHAPES) >= 30
    assert {"prefill", "prefill-unaligned", "mid-m", "short-k", "skinny-n", "decode", "batched"} <= cats
    assert {s[-1] for s in ceiling.SHAPES} == {"row", "col"}


def test_sweep_configs_are_valid_for_the_problem_and_shared_across_shapes():
    (_, a), (_, b) = ceiling.problems(2)
    for variant in ("ptr", "tma", "persistent"):
        ca = ceiling.sweep_configs(a, variant, 300, H200, 0)
        cb = ceiling.sweep_configs(b, variant, 300, H200, 0)
        assert len(ca) == 300 and {c.variant for c in ca} == {variant}
        assert not [c for c in ca if violations(c, H200, a.dtype, a.k)]
        assert ca[:50] == cb[:50]  # one order: shapes of one specialisation share compiles
        allowed = {c.split_k for c in space("hopper-all") if c.variant == variant and not violations(c, H200, "bf16")}
        assert {c.split_k for c in ca[:10]} == allowed  # split-K groups in turn


def test_named_tiles_come_first_in_each_variant_without_repeats():
    problem = ceiling.problems(1)[0][1]
    plain = ceiling.sweep_configs(problem, "subtile", 50, H200, 0)
    seeded = ceiling.sweep_configs(problem, "subtile", 50, H200, 0, ("triton_tutorial",))
    named = [c for c in seeded if c not in plain]
    assert named and seeded[:len(named)] == named and len(seeded) == len(set(seeded))
    assert all(c.variant == "subtile" and not violations(c, H200, "bf16", problem.k) for c in seeded)
    assert {(c.block_m, c.block_n, c.block_k) for c in named} <= {(c.block_m, c.block_n, c.block_k)
                                                                  for c in named_list("triton_tutorial")}


def test_odd_n_gets_no_tma_configs():
    problem = next(p for _, p in ceiling.problems() if p.n == 1001)
    assert ceiling.sweep_configs(problem, "persistent", 300, H200, 0) == []
    assert len(ceiling.sweep_configs(problem, "ptr", 300, H200, 0)) == 300


def test_neighbours_move_one_knob_one_step_and_keep_the_variant():
    config = ceiling.sweep_configs(ceiling.problems(1)[0][1], "persistent", 1, H200, 0)[0]
    near = ceiling.neighbours(config)
    assert near and all(n.variant == config.variant for n in near)
    for n in near:
        diffs = [f for f in ("block_m", "block_n", "block_k", "split_k", "group_m", "num_warps", "num_stages")
                 if getattr(n, f) != getattr(config, f)]
        assert len(diffs) == 1
    crossed = ceiling.neighbours(config, ("tma", "persistent", "subtile"))
    assert crossed[:len(near)] == near
    assert [(c.variant, dataclasses.replace(c, variant=config.variant)) for c in crossed[len(near):]] == \
        [("tma", config), ("subtile", config)]


def test_run_sweeps_refines_confirms_and_reports(tmp_path, capsys):
    db = str(tmp_path / "c.sqlite")
    ceiling.main(["--db", db, "--gpu", "h200", "--shapes", "2", "--configs", "4", "--variant", "ptr",
                  "--variant", "persistent", "--max-rounds", "2", "--runner", "tests.fake_runner:measure",
                  "--shard-dir", str(tmp_path / "shards"), "--json", str(tmp_path / "s.json")])
    counts = json.loads(capsys.readouterr().out.splitlines()[0])
    assert counts["refine_rounds"] >= 1 and counts["retimed"] > 0 and counts["shard_rows"] > 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert len(summary["shapes"]) == 2
    # the fake runner's TFLOP/s is BLOCK_M: refinement climbs from the sweep's best
    for (_, problem), shape in zip(ceiling.problems(2), summary["shapes"]):
        swept = max(c.block_m for c in ceiling.sweep_configs(problem, "ptr", 4, H200, 0))
        assert shape["per_variant"]["ptr"] > swept or swept == 256
    with Database(db) as d:
        assert d.retimed("H200-SXM-141GB")


def test_timeout_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ceiling.main(["--db", str(tmp_path / "c.sqlite"), "--timeout", "0"])
    assert "--timeout: must be more than 0, got 0" in capsys.readouterr().err
    assert not (tmp_path / "c.sqlite").exists()
