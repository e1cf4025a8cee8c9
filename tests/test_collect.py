"""gnn-policy collect with a fake runner: what it measures, that it resumes, that rows land."""
import dataclasses
from collections import Counter

import hardware_specs
from gnn_policy.collect import CollectArgs, plan, run, select_problems
from gnn_policy.database import Database
from gnn_policy.pools import class_order, config_pool, kernel_class, stratified_configs
from gnn_policy.space import space, violations

H200 = hardware_specs.load("h200")


def test_problem_selection_spreads_over_families():
    chosen = select_problems("all", 30, seed=0)
    assert len(chosen) == 30 and len({p.key for p in chosen}) == 30
    per_family = Counter(p.model for p in chosen)
    assert len(per_family) == 10 and max(per_family.values()) - min(per_family.values()) <= 1
    assert len(select_problems("test", 0, seed=0)) == len(select_problems("test", 10**6, seed=0))


def test_a_split_selection_is_the_all_selection_restricted_to_it():
    from graphs.suite import SPLITS

    everything = select_problems("all", 200, seed=3)
    tests = [p for p in everything if p.model in SPLITS["test"]]
    assert select_problems("test", len(tests), seed=3) == tests
    small = select_problems("train", 20, seed=3, max_gflop=10)
    assert len(small) == 20 and max(p.flops for p in small) <= 10e9
    assert small == [p for p in select_problems("train", 200, seed=3) if p.flops <= 10e9][:20]
    large = select_problems("train", 20, seed=3, min_gflop=100)
    assert len(large) == 20 and min(p.flops for p in large) > 100e9
    assert large == [p for p in select_problems("train", 400, seed=3) if p.flops > 100e9][:20]


def test_stratified_sample_covers_variants_and_split_k():
    import random

    valid = [c for c in space("full") if not violations(c, H200, "bf16", 4096)]
    picked = stratified_configs(valid, 200, random.Random(0))
    assert len(picked) == 200 and len(set(picked)) == 200
    groups = Counter((c.variant, c.split_k) for c in picked)
    assert len(groups) == 10 and min(groups.values()) >= 20


def test_plan_has_cublas_named_lists_and_only_valid_configs():
    problem = select_problems("test", 1, seed=1)[0]
    (p, configs), = plan([problem], H200, CollectArgs(db="unused", configs=50))
    assert configs[0] is None and len(configs) > 50
    assert all(not violations(c, H200, p.dtype, p.k) for c in configs[1:])


def test_collect_stores_rows_and_resumes(tmp_path):
    args = CollectArgs(db=str(tmp_path / "m.sqlite"), gpu="h200", split="test", problems=3, configs=6,
                       runner="fake_runner:measure", timeout=30, shard_dir=str(tmp_path / "shards"))
    first = run(args)
    assert first["measured"] > 3 * 6 and first["ok"] == first["measured"]
    assert first["shard_rows"] == first["measured"] and len(list((tmp_path / "shards").iterdir())) == 1
    again = run(args)
    assert again.get("measured", 0) == 0 and again["skipped"] == first["measured"]
    assert "shard_rows" not in again or again["shard_rows"] == 0
    with Database(tmp_path / "m.sqlite") as db:
        stats = db.stats()["gpus"]["H200-SXM-141GB"]
    assert stats["problems"] == 3 and stats["real_ok"] == first["measured"]


def test_config_pools_are_nested_stratified_and_feed_every_problem():
    valid = [c for c in space("full") if not violations(c, H200, "bf16")]
    small, big = config_pool(valid, 100, seed=0), config_pool(valid, 400, seed=0)
    assert big[:100] == small and len(set(big)) == 400
    assert len(Counter((c.variant, c.split_k) for c in small)) == 10
    assert len(config_pool(valid, 0, seed=0)) == len(valid)
    problems = select_problems("train", 4, seed=0)
    planned = plan(problems, H200, CollectArgs(db="unused", configs=50, pool=100, lists=False))
    pools = {p.dtype: set(config_pool([c for c in space("full") if not violations(c, H200, p.dtype)], 100, 0))
             for p in problems}
    assert all(len(cs) == 50 and set(cs) <= pools[p.dtype] for p, cs in planned)


def test_kernel_classes_get_their_own_pools_and_are_measured_together():
    problems = select_problems("random-train", 300, seed=0)
    ordered = class_order(problems, seed=0)
    assert sorted(p.key for p in ordered) == sorted(p.key for p in problems)
    seen, last = [], None
    for p in ordered:  # each class is one run of consecutive problems
        if kernel_class(p) != last:
            assert kernel_class(p) not in seen
            last = kernel_class(p)
            seen.append(last)
    assert class_order(problems, seed=1) != ordered  # the classes' order is the seed's
    twins = next(g for g in _groups(problems).values() if len(g) >= 3)
    args = CollectArgs(db="unused", configs=60, pool=120, lists=False, pool_by_class=True, space="hopper-tested")
    planned = dict((p.key, set(cs)) for p, cs in plan(twins, H200, args))
    shared = set.intersection(*planned.values())
    assert len(set.union(*planned.values())) <= 120 and shared  # one pool feeds the class
    other = next(g[0] for k, g in _groups(problems).items() if k != kernel_class(twins[0]) and g[0].dtype == twins[0].dtype)
    assert set(plan([other], H200, args)[0][1]) != planned[twins[0].key]
    flat = set(plan(twins[:1], H200, dataclasses.replace(args, pool_by_class=False))[0][1])
    assert flat != planned[twins[0].key]  # without --pool-by-class the dtype's one pool, as before


def _groups(problems):
    out = {}
    for p in problems:
        out.setdefault(kernel_class(p), []).append(p)
    return out


def test_time_limit_starts_no_new_problem_and_a_second_run_finishes(tmp_path):
    args = CollectArgs(db=str(tmp_path / "m.sqlite"), gpu="h200", split="test", problems=2, configs=4,
                       runner="fake_runner:measure", time_limit=1e-9)
    stopped = run(args)
    assert stopped["stopped_by_time_limit"] == 1 and stopped["measured"] == 0
    finished = run(dataclasses.replace(args, time_limit=0.0))
    assert finished["problems_done"] == 2 and "stopped_by_time_limit" not in finished


def test_a_random_split_plan_keeps_tma_off_unaligned_rows_and_measures_the_baselines():
    from gnn_policy.baselines import default_pick, fits
    from gnn_policy.space import named_list, tma_fits

    problems = select_problems("random-train", 40, seed=0)
    assert problems == select_problems("random-train", 40, seed=0) and len({p.key for p in problems}) == 40
    args = CollectArgs(db="unused", split="random-train", configs=60, named=("triton_tutorial", "inductor_mm"))
    planned = plan(problems, H200, args)
    unaligned = [(p, cs) for p, cs in planned if not tma_fits(p)]
    assert unaligned and all(c.variant == "ptr" for _, cs in unaligned for c in cs[1:])
    for p, cs in planned:
        assert cs[0] is None and len(set(cs)) == len(cs)  # cuBLAS first, nothing twice
        assert default_pick(p, H200, fits(space("full"), H200, p)) in cs
        assert set(named_list("inductor_mm")) - set(cs) <= {c for c in named_list("inductor_mm") if violations(
            c, H200, p.dtype, p.k)} and len(cs) <= 1 + 60 + 1 + 16 + 20  # the seed list stays out
        assert all(not violations(c, H200, p.dtype, p.k) for c in cs[1:])
    long_k = next(cs for p, cs in planned if tma_fits(p) and p.k >= 4096)
    assert len(Counter((c.variant, c.split_k) for c in long_k[1:61])) == 10  # every stratum of the space


def test_the_strata_come_from_the_space_given():
    problem = select_problems("random-val", 1, seed=0, where=lambda p: p.k >= 128)[0]
    (_, configs), = plan([problem], H200, CollectArgs(db="unused", space="seed", configs=30, lists=False))
    assert len(configs) == 30 and all(c in space("seed") for c in configs)
    assert Counter(c.split_k for c in configs) == {1: 10, 2: 10, 4: 10}  # the seed space's strata, ptr only


def test_collect_on_a_random_split_reports_its_throughput(tmp_path, capsys):
    args = CollectArgs(db=str(tmp_path / "m.sqlite"), gpu="h200", split="random-test", problems=2, configs=5,
                       named=("triton_tutorial",), runner="fake_runner:measure", timeout=30)
    out = run(args)
    assert out["problems_done"] == 2 and out["measured"] >= 2 * 7 and out["kernels"] == 0
    assert out["per_minute"] > 0 and "measurements, 0 Triton specialisations" in capsys.readouterr().err
    with Database(tmp_path / "m.sqlite") as db:
        assert {p.model for p in db.problems("H200-SXM-141GB")} == {"random"}


def test_take_compiled_counts_specialisations_not_jobs():
    from collections import defaultdict

    from gnn_policy.collect import take_compiled
    from gnn_policy.measure.compile import CompileResult

    problem = select_problems("random-test", 1, seed=0)[0]
    configs = [None, *space("seed").points[:3]]
    results = iter([CompileResult(problem.key, c.key, "ok", 0.5, kernel=k) for c, k in zip(configs[1:], "aab")])
    counts, kernels = defaultdict(int), set()
    rows, measure = take_compiled(problem, configs, results, "H200-SXM-141GB", counts, kernels)
    assert rows == [] and measure == configs and counts["compile_jobs"] == 3 and kernels == {"a", "b"}


def test_a_policy_adds_its_picks_within_the_runs_space():
    """--policy measures the checkpoint's top picks beside the sample, each once and only those of
    the run's space (the shipped policy's space is the full one)."""
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy

    problem = select_problems("random-val", 1, seed=0, where=lambda p: p.k >= 128)[0]
    args = CollectArgs(db="unused", space="hopper-tested", configs=20, lists=False)
    (_, without), = plan([problem], H200, args)
    (_, with_picks), = plan([problem], H200, dataclasses.replace(args, policy=str(DEFAULT_CHECKPOINT), policy_top=8))
    picks = [p.config for p in Policy.load(DEFAULT_CHECKPOINT).top_k(problem, H200, 8)]
    added = with_picks[len(without):]
    assert with_picks[:len(without)] == without and len(set(with_picks)) == len(with_picks)
    assert set(added) == {c for c in picks if c in space("hopper-tested") and c not in without} and added


def test_a_resumed_collection_measures_new_problems_before_more_configs_of_old_ones(tmp_path):
    import dataclasses as dc

    args = CollectArgs(db=str(tmp_path / "m.sqlite"), gpu="h200", split="random-train", problems=3, configs=4,
                       lists=False, pool=0, runner="fake_runner:measure", timeout=30)
    run(args)
    old = {p.key for p in select_problems("random-train", 3, 0)}
    with Database(tmp_path / "m.sqlite") as db:
        after = db.high_water()[0]
    second = run(dc.replace(args, problems=5, configs=8))  # two new problems, more configs of old ones
    with Database(tmp_path / "m.sqlite") as db:
        order = list(dict.fromkeys(r["problem"] for r in db.rows_after(after)))
    assert second["measured"] > 0 and set(order[:2]).isdisjoint(old) and set(order[2:]) <= old and order[2:]
