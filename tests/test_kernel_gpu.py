"""GPU-only checks of the template: random (shape, config, dtype) cases, bf16 included.

Every case must be either correct against a float64 reference or rejected before launch
with `InvalidConfigError`; a wrong result, an unwritten element, a kernel that never returns
(killed after GNN_POLICY_GPU_CASE_TIMEOUT s) or a load-time failure such as Triton's
OutOfResources fails the test. Set GNN_POLICY_GPU_REPORT to a path to get a JSON
record of what ran, and beside it `<path>.progress.jsonl`, one line per case as it starts.
"""
from __future__ import annotations

import importlib
import json
import os
import random

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import hardware_specs  # noqa: E402
from graphs import GemmProblem  # noqa: E402
from gnn_policy import InvalidConfigError, TileConfig, matmul, space, violations  # noqa: E402
from gnn_policy.space import tma_fits  # noqa: E402
from gnn_policy.baselines import config_fits  # noqa: E402
from gnn_policy.kernels.reference import TOLERANCE, reference, relative_error  # noqa: E402
from gnn_policy.measure.compile import precompile  # noqa: E402
from gnn_policy.measure.inputs import make_inputs  # noqa: E402
from gnn_policy.measure.workers import ProblemSetupError, WorkerPool  # noqa: E402

CASES = int(os.environ.get("GNN_POLICY_GPU_CASES", "480"))
VARIANT_CASES = int(os.environ.get("GNN_POLICY_GPU_VARIANT_CASES", "320"))
CASE_TIMEOUT = float(os.environ.get("GNN_POLICY_GPU_CASE_TIMEOUT", "30"))  # seconds to check and time one case
TRIAL_CASES = int(os.environ.get("GNN_POLICY_GPU_TRIAL_CASES", "120"))  # the warpspec trial's
DIMS = (1, 7, 16, 33, 64, 100, 128, 255, 256, 1000, 1024, 2048)


def _random_problem(rng: random.Random) -> GemmProblem:
    return GemmProblem(
        m=rng.choice(DIMS), n=rng.choice(DIMS), k=rng.choice(DIMS + (4096,)),
        batch=rng.choice((1, 1, 1, 2, 3)), dtype=rng.choice(("bf16", "bf16", "fp16", "fp32")),
        a_layout=rng.choice(("row", "row", "col")), b_layout=rng.choice(("row", "col")),
        bias=rng.random() < 0.3, activation=rng.choice((None, None, "relu", "gelu", "silu")),
        residual=rng.random() < 0.2)


def _random_cases(n: int, gpu, variant: str | None = None, seed: int = 1234) -> list[tuple[GemmProblem, TileConfig]]:
    """Half the configs from the whole space (most break a rule somewhere), half valid;
    with `variant`, only configs of that variant of the `hopper` space."""
    rng = random.Random(seed)
    full = list(space("full")) if variant is None else [c for c in space("hopper-all") if c.variant == variant]
    valid = {d: [c for c in full if not violations(c, gpu, d)] for d in ("bf16", "fp16", "fp32")}
    cases = []
    for i in range(n):
        problem = _random_problem(rng)
        # a variant's rules reject most of the space: three cases in four draw valid configs, and
        # (the variants load by TMA) a problem whose strides TMA can read; the fourth keeps odd sizes
        pool = full if (i % 2 if variant is None else i % 4 == 3) else valid[problem.dtype]
        # a dtype the variant's rules refuse outright has no valid config to draw
        while variant is not None and pool is not full and not (tma_fits(problem) and valid[problem.dtype]):
            problem = _random_problem(rng)
            pool = valid[problem.dtype]
        config = rng.choice(pool)
        for _ in range(20):  # prefer a config whose SPLIT_K fits this K
            if pool is full or not violations(config, gpu, problem.dtype, problem.k):
                break
            config = rng.choice(pool)
        cases.append((problem, config))
    return cases


def test_detect_matches_the_device():
    spec = hardware_specs.detect()
    props = torch.cuda.get_device_properties(0)
    assert spec.sm_count == props.multi_processor_count
    assert spec.l2_bytes == props.L2_cache_size


def test_random_cases_are_correct_or_rejected_up_front():
    _check_cases(_random_cases(CASES, hardware_specs.detect()), os.environ.get("GNN_POLICY_GPU_REPORT"))


@pytest.mark.parametrize("variant,seed", [("persistent", 99), ("subtile", 98), ("streamk", 97)])
def test_persistent_variant_is_correct_or_rejected_up_front(variant, seed):
    report = os.environ.get("GNN_POLICY_GPU_REPORT")
    _check_cases(_random_cases(VARIANT_CASES, hardware_specs.detect(), variant, seed=seed),
                 report and report.replace(".json", f"_{variant}.json"))



def _refused(problem: GemmProblem, config: TileConfig, gpu) -> bool:
    return not config_fits(config, gpu, problem)


def _run_case(pool: WorkerPool, problem: GemmProblem, config: TileConfig, gpu, seed: int) -> dict:
    if _refused(problem, config, gpu):
        try:
            matmul(**make_inputs(problem, "cuda", seed=seed), config=config)
            return dict(outcome="failed", error="the rules refuse it, but matmul launched it")
        except InvalidConfigError as exc:
            return dict(outcome="rejected", rules=[v.rule for v in exc.violations])
        except Exception as exc:  # noqa: BLE001 - any other failure is a bug
            return dict(outcome="failed", error=f"{type(exc).__name__}: {exc}"[:300])
    try:
        (m,) = pool.run(problem, [config])
    except ProblemSetupError as exc:  # the inputs or the reference, not the config: still a failure here
        return dict(outcome="failed", error=str(exc)[:300])
    outcome = {"ok": "correct", "wrong_result": "wrong", "timeout": "hung"}.get(m.status, "failed")
    return dict(outcome=outcome, error=m.error or m.max_rel_err)


def _check_cases(cases: list[tuple[GemmProblem, TileConfig]], report: str | None,
                 timeout_s: float = CASE_TIMEOUT, max_hung: int | None = None) -> None:
    """A case the rules refuse must be refused by `matmul` before launch. Every other case runs
    in the measuring worker, which checks it against the float64 reference (into an output
    filled with NaN) before timing it: a kernel that never returns is killed after
    `timeout_s` and recorded as `hung`, and the next case runs in a fresh worker, so one
    hang names itself instead of ending the run. After `max_hung` hangs the rest are skipped:
    the verdict is already a failure, and every further hang costs a full timeout of GPU time."""
    gpu = hardware_specs.detect()
    precompile([(p, [c]) for p, c in cases if not _refused(p, c, gpu)], progress=False)
    record = []
    progress = open(report + ".progress.jsonl", "w") if report else None
    try:
        with WorkerPool("gnn_policy.measure.runner:measure_configs", gpu=gpu.name, timeout_s=timeout_s,
                        replays=3) as pool:
            for i, (problem, config) in enumerate(cases):
                entry = {"problem": problem.key, "config": config.key}
                if progress:
                    progress.write(json.dumps(dict(entry, case=i)) + "\n")
                    progress.flush()
                record.append(entry)
                entry.update(_run_case(pool, problem, config, gpu, i))
                if max_hung is not None and sum(r["outcome"] == "hung" for r in record) >= max_hung:
                    break
    finally:  # the record of what ran survives a run that stops part way
        if progress:
            progress.close()
        if report:
            with open(report, "w") as f:
                json.dump(record, f, indent=1)
    failures = [r for r in record if r["outcome"] not in ("correct", "rejected")]
    counts = {o: sum(r["outcome"] == o for r in record) for o in ("correct", "rejected", "wrong", "hung", "failed")}
    print("gpu cases:", counts, f"({len(record)} of {len(cases)} ran)")
    assert not failures, failures[:10]
    assert counts["correct"] >= 0.4 * len(cases), counts


@pytest.mark.parametrize("config", [TileConfig(16, 64, 128, 16, 8, 4, 4, "tma"),
                                    TileConfig(16, 64, 128, 16, 8, 4, 4, "persistent"),
                                    TileConfig(64, 64, 128, 8, 8, 4, 3, "persistent"),
                                    TileConfig(64, 64, 128, 4, 8, 4, 3, "subtile"),
                                    TileConfig(64, 64, 128, 1, 8, 4, 3, "streamk")])
def test_split_k_is_deterministic(config):
    problem = GemmProblem(16, 4096, 4096, dtype="bf16")
    args = make_inputs(problem, "cuda", seed=7)
    first = matmul(**args, config=config)
    for _ in range(5):
        assert torch.equal(matmul(**args, config=config), first)


@pytest.mark.parametrize("programs", [1, 7, 132, 10_000])
def test_persistent_grid_size_never_changes_the_result(programs):
    """Any grid, from one program looping over every unit to more programs than units."""
    from gnn_policy.kernels.launch import launch

    problem = GemmProblem(1000, 1000, 1000, batch=2, dtype="bf16", b_layout="col", bias=True,
                          activation="gelu")
    args = make_inputs(problem, "cuda", seed=5)
    ref = reference(**args)
    for config in (TileConfig(128, 64, 64, 2, 8, 4, 3, "persistent"), TileConfig(128, 64, 64, 1, 8, 4, 3, "streamk")):
        out = launch(args["a"], args["b"], config, bias=args["bias"], activation="gelu", residual=None,
                     programs=programs)
        assert relative_error(out, ref) <= TOLERANCE[torch.bfloat16], config.key


def test_bf16_epilogues_match_torch():
    for activation in (None, "relu", "gelu", "silu"):
        problem = GemmProblem(200, 1000, 1000, dtype="bf16", bias=True, activation=activation,
                              residual=True)
        args = make_inputs(problem, "cuda", seed=3)
        for variant in ("ptr", "tma", "persistent", "subtile", "streamk"):
            config = TileConfig(64, 64, 64, 1 if variant == "streamk" else 2, 8, 4, 3, variant)
            try:
                out = matmul(**args, config=config)
            except InvalidConfigError as exc:  # 1000-wide bf16 rows are 16-byte aligned: never here
                pytest.fail(str(exc))
            assert relative_error(out, reference(**args)) <= TOLERANCE[torch.bfloat16]


def test_default_config_runs_on_the_gpu():
    args = make_inputs(GemmProblem(1000, 1000, 1000, dtype="bf16"), "cuda", seed=1)
    assert relative_error(matmul(**args), reference(**args)) <= TOLERANCE[torch.bfloat16]


def test_warpspec_trial_with_the_sm90_rule_lifted(monkeypatch):
    """The GPU trial that decides whether the `warpspec-sm90` rule can go: the variant's random
    cases with the rule lifted, here and in the measuring workers. A wrong result or a hang
    fails it (on 2026-12-07, Triton 3.6: 16 wrong of 160, none hung). Last in the file, with a
    short case timeout, so a hang costs the other tests nothing."""
    space_module = importlib.import_module("gnn_policy.space")
    monkeypatch.setenv("GNN_POLICY_LIFT_RULES", "warpspec-sm90")
    monkeypatch.setattr(space_module, "LIFTED_RULES", frozenset({"warpspec-sm90"}))
    report = os.environ.get("GNN_POLICY_GPU_REPORT")
    _check_cases(_random_cases(TRIAL_CASES, hardware_specs.detect(), "warpspec", seed=96),
                 report and report.replace(".json", "_warpspec.json"), timeout_s=min(CASE_TIMEOUT, 10.0), max_hung=2)


def test_launch_plans_match_launch_bit_for_bit():
    """A plan (kernels/plan.py) launches the compiled kernel directly with a call's tensors in
    the first call's arguments: for new inputs of the same signature, on the default stream and
    on another, its result is launch's, bit for bit (split-K reduces in a fixed order)."""
    from gnn_policy.kernels.launch import LayoutError, launch
    from gnn_policy.kernels.plan import make_plan

    gpu = hardware_specs.detect()
    side = torch.cuda.Stream()
    ran = 0
    for problem, config in _random_cases(120, gpu, seed=4321):
        if config.variant not in ("ptr", "tma") or violations(config, gpu, problem.dtype, problem.k):
            continue
        first = make_inputs(problem, "cuda", seed=1)
        act = first.pop("activation")
        try:
            c, plan = make_plan(**first, config=config, activation=act)
        except LayoutError:  # TMA on strides it cannot describe: launch refuses it alike
            continue
        assert plan is not None and plan.compiled is not None, config.key
        assert relative_error(c, reference(**first, activation=act)) <= TOLERANCE[c.dtype], config.key
        call = make_inputs(problem, "cuda", seed=2)
        call.pop("activation")
        want = launch(**call, config=config, activation=act)
        assert torch.equal(plan.run(call["a"], call["b"], call["bias"], call["residual"]), want), config.key
        with torch.cuda.stream(side):
            got = plan.run(call["a"], call["b"], call["bias"], call["residual"])
        side.synchronize()
        assert torch.equal(got, want), config.key
        ran += 1
    assert ran >= 30


def test_a_patched_layer_runs_its_plan_from_the_third_call():
    from gnn_policy.kernels.plan import LaunchPlan
    from gnn_policy.patching import NO_PLAN, TritonLinear

    torch.manual_seed(0)
    linear = torch.nn.Linear(4096, 1024, device="cuda", dtype=torch.bfloat16)
    layer = TritonLinear(linear)
    with torch.inference_mode():
        for tokens in (1, 16, 300):
            x = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16)
            outs = [layer(x) for _ in range(3)]
            want = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
            assert relative_error(outs[0], want) <= TOLERANCE[torch.bfloat16]
            assert all(torch.equal(o, outs[0]) for o in outs[1:])
    plans = [plan for _, plan in layer._plans.values()]
    # a persistent pick has none; every other shape runs one
    assert all(p is NO_PLAN or isinstance(p, LaunchPlan) for p in plans)
    assert any(isinstance(p, LaunchPlan) for p in plans)
