"""`gnn-policy finetune --gpu NAME --budget B`: adapt a pretrained policy to one GPU.

Each round spends a share of the budget on every tuning problem (`training.finetune_measure`):
on the GEMMs a user serves (`--model`, `--keys`) down the policy's own ranking, on a split's
problems on configs chosen for information (the policy's first pick, where it disagrees with
itself, neighbours of the best found), measured for real, with the analytic
model under `--simulate`, or from a replay. Every measurement goes to the database. After
each round, the policy takes gradient steps by `--strategy` (`training.adaptation`): the
whole network (REINFORCE plus the pretraining objective, as Reptile's inner loop adapts), the
GPU's calibration alone (its embedding and the cost head's last layer), or the calibration
then the whole network. The card records each loss's gradient norm. At the end, a cross-fit
over the tuning problems (`training.guard`) decides which weights are kept: where adapting on
half of the problems does not pick better on the other half, the run falls back to the
calibration alone or to the starting weights, and says so. The budget is never overspent: a
count budget is exact, and a time budget stops before the next batch once it is used. A state
file makes the run resumable; between rounds the adapted weights are `<gpu>.rounds.pt`, and
`<gpu>.pt` with its card appears only when the run has ended.
"""
from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

from graphs.problem import DTYPES
from gnn_policy.args import at_least, flag, int_list, one_of, parse_keys, positive, problem_keys
from gnn_policy.atomic import write_text
from gnn_policy.collect import SPLIT_NAMES
from gnn_policy.database import DEFAULT_PATH
from gnn_policy.interrupts import on_interrupt
from gnn_policy.measure.workers import runner_path
from training.adaptation import STRATEGIES, AdaptPlan
from training.finetune_budget import PER_PROBLEM, Budget, FinetuneError, budget_error, budget_text
from training.finetune_measure import measure_round, measurer
from training.finetune_report import start_picks

# raise when the adaptation changes: transfer then re-runs its fine-tunes (2: the objective, 3: the guard,
# 4: strategies, measurements chosen for information, the bounded model's first-pick rule in the guard,
# 5: an ensemble adapts every member and is judged by its vote; the calibration's learning rate 3e-4;
# the first round measures every problem's start pick, and a round's remainder goes on where the last stopped;
# 6: the start pick by the policy's own first-pick rule, which is not the best predicted under every rule;
# --model's and --keys' problems measured down the policy's own ranking)
ADAPT_VERSION = 6


@dataclasses.dataclass(frozen=True)
class FinetuneArgs:
    """Adapt a pretrained policy to one GPU on a budget of real measurements (resumable)."""

    gpu: str = flag(help="GPU to adapt to: a spec name (h200) or an SM slice of the local one (h200-sm64)")
    budget: str = flag("64", f"real measurements (64, at most {PER_PROBLEM} per tuning problem) or measuring time "
                             "(10m, 90s)", check=budget_text)
    db: str = flag(str(DEFAULT_PATH), "the SQLite database; the shipped snapshot is loaded into it first")
    checkpoint: str = flag("", "policy to start from (default: checkpoints/pretrained.pt)")
    output: str = flag("checkpoints", "folder for <gpu>.pt, <gpu>.card.json and the resume state")
    split: str = flag("", "suite split the tuning problems come from (empty: train); not with --model",
                      check=one_of(*SPLIT_NAMES))
    model: str = flag("", "tune on the distinct GEMMs of the model you serve instead of a split: a config.json "
                          "(or a shipped example: llama-3-8b, gpt2, mixtral-8x7b) or module:function, as tune "
                          "--model reads it")
    tokens: str = flag("", "token counts of --model's GEMMs, comma-separated; empty: 1,16,128,2048",
                       check=int_list(1))
    dtype: str = flag("", "dtype of --model's GEMMs: fp16, bf16 or fp32 (empty: bf16, as tune --model)",
                      check=one_of("", *DTYPES))
    tp: int = flag(1, "tensor-parallel degree of a --model config: tune one GPU's share of its GEMMs, as tune "
                      "--model --tp splits them", check=at_least(1))
    keys: str = flag("", "tune on exactly these GEMMs instead of a split's: problem keys as tune --json and "
                         "transfer.csv name them (1x16x4096x4096_bf16_rc_bgelu), comma-separated, or @FILE with "
                         "one a line; not with --model or --split", check=problem_keys)
    problems: int = flag(8, "tuning problems, spread over the split's families (or the most of --model's "
                            "distinct GEMMs, taken in turn from each token count, or of --keys, in their order)",
                         check=at_least(1))
    rounds: int = flag(4, "measure-then-adapt rounds the budget is spread over", check=at_least(1))
    strategy: str = flag("calibrate", "what adapts: calibrate (the GPU embedding and the cost head's last layer "
                                      "alone), whole (every weight), calibrate-whole (the calibration, then every "
                                      "weight)", check=one_of(*STRATEGIES))
    steps: int = flag(5, "whole-network gradient steps after each round: as many as Reptile's inner loop takes",
                      check=at_least(0))
    lr: float = flag(3e-4, "learning rate of the whole-network steps", check=positive)
    calibration_steps: int = flag(20, "calibration steps after each round (--strategy calibrate, calibrate-whole)",
                                  check=at_least(0))
    calibration_lr: float = flag(3e-4, "learning rate of the calibration steps", check=positive)
    guard: bool = flag(True, "keep the adapted weights only where a cross-fit over the tuning problems says they "
                             "pick better than the starting ones (or the calibration alone, where it does)",
                       off="always keep the adapted weights (no cross-fit)")
    simulate: bool = flag(False, "measure with the analytic model (source=simulated), for a GPU not here")
    analytic: str = flag("", "the fitted analytic model --simulate measures with (default: checkpoints/analytic.json)")
    replay: str = flag("", "answer every measurement from the real rows of --gpu stored in this database instead "
                           "of measuring: a CPU dry run on real labels, candidates limited to the stored configs "
                           "(needs --no-snapshot)")
    seed: int = flag(0, "seed of problem choice, mutations and shuffling")
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is a timeout", check=positive)
    runner: str = flag("gnn_policy.measure.runner:measure_configs", "measuring function (package.module:function)",
                       check=runner_path)
    snapshot: bool = flag(True, "load the shipped snapshot into --db first",
                          off="adapt on the run's own measurements alone, as the transfer experiment's runs must "
                              "(--db must then hold no earlier rows of this GPU)")
    log_dir: str = flag("runs/finetune", "folder of the offline W&B run")
    group: str = flag("", "W&B group (default: transfer-<gpu>)")
    tags: tuple[str, ...] = flag((), "W&B tags, e.g. method=meta budget=64 (repeatable)", action="append")
    wandb: bool = flag(True, "log to W&B (offline unless WANDB_MODE is set)", off="write no W&B run")
    json: bool = flag(False, "print the run's card as JSON instead of the table of what it measured")

    def __post_init__(self) -> None:
        for other in ("model", "split"):
            if self.keys and getattr(self, other):
                raise ValueError(f"--keys and --{other} are exclusive: --keys names the GEMMs to tune on itself")
        if self.model and self.split:
            raise ValueError(f"--model and --split {self.split} are exclusive: --model tunes on the model's own "
                             "GEMMs, --split on a suite split's problems")
        if self.tokens and not self.model:
            raise ValueError("--tokens sets the token counts of --model's GEMMs: give --model too")
        if self.tp != 1 and not self.model:
            raise ValueError("--tp splits the GEMMs of --model's config: give --model too")
        if self.dtype and not self.model:
            raise ValueError("--dtype sets the dtype of --model's GEMMs (a split's problems carry their own): "
                             "give --model too")
        # a model's problem count is known once it is expanded: `run` checks it then
        count = min(self.problems, len(parse_keys(self.keys))) if self.keys else self.problems
        why = "" if self.model else budget_error(self.budget, count, "--keys" if self.keys else "--problems")
        if why:
            raise ValueError(why)

    @property
    def plan(self) -> AdaptPlan:
        return AdaptPlan(self.strategy, self.steps, self.lr, self.calibration_steps, self.calibration_lr)


def check_gpu(spec, local, simulate: bool) -> None:
    """Refuse to label measurements of this machine with another GPU's name."""
    if simulate:
        return
    if local is None:
        raise FinetuneError(f"no CUDA GPU here: real measurements of {spec.name} need one "
                            "(--simulate measures with the analytic model instead)")
    if (spec.slice_of or spec.name) != local.name:
        raise FinetuneError(f"--gpu {spec.name} does not match this machine's {local.name}: measurements here "
                            f"would be labelled with the wrong GPU. Use --gpu {local.name.lower()} (or a slice "
                            "of it, e.g. h200-sm64), or --simulate to adapt on the analytic model's labels")


def run(args: FinetuneArgs) -> dict:
    import torch

    import hardware_specs
    from gnn_policy.database import Database
    from gnn_policy.policy import DEFAULT_CHECKPOINT, Policy, save_checkpoint
    from gnn_policy.snapshot import load_shipped
    from training.adaptation import Adapter
    from training.guard import calibrated_only, cross_fit
    from training.transfer_log import file_digest
    from training.tuning_problems import expand, nothing_held, select

    spec = hardware_specs.load(args.gpu)
    # a bad SPEC fails before anything is written
    dtype = args.dtype or "bf16"  # of --model's GEMMs, as tune --model's default
    model = expand(args.model, args.tokens, dtype, args.tp) if args.model else None
    keyed = parse_keys(args.keys) if args.keys else None
    split = args.split or ("" if model or keyed else "train")
    budget = Budget.parse(args.budget)
    if args.replay and (args.simulate or args.snapshot):
        raise FinetuneError("--replay answers from stored real rows: it goes without --simulate, and with "
                            "--no-snapshot (the snapshot would already hold the rows it replays)")
    source = "simulated" if args.simulate else "real"
    out = Path(args.output)
    name = args.gpu if source == "real" else f"{args.gpu}.simulated"
    state_path, weights = out / f"{name}.finetune.json", out / f"{name}.pt"
    rounds_path = out / f"{name}.rounds.pt"  # a run stopped part way leaves no result-looking checkpoint
    start_path = Path(args.checkpoint or DEFAULT_CHECKPOINT)
    if not start_path.exists():
        raise FinetuneError(f"no policy checkpoint at {start_path}; train one with `gnn-policy pretrain`")
    if start_path.resolve() in (weights.resolve(), rounds_path.resolve()):  # the guard's fallback needs the start intact
        raise FinetuneError(f"--checkpoint {start_path} is the file this run writes: give another --output")
    start_policy = Policy.load(start_path)  # a file that is no checkpoint is refused before anything is written
    if not (args.simulate or args.replay):
        check_gpu(spec, hardware_specs.detect() if torch.cuda.is_available() else None, args.simulate)
    # by content, not only path: a start replaced between resumes is another run
    plan = {k: getattr(args, k) for k in ("budget", "rounds", "problems", "seed", "checkpoint", "strategy", "steps",
                                          "lr", "calibration_steps", "calibration_lr", "guard", "snapshot",
                                          "analytic", "replay", "model", "tokens")} | \
        {"keys": ",".join(p.key for p in keyed) if keyed else "", "split": split, "model_digest": model.digest if model else "", "adapt": ADAPT_VERSION,
         "start_digest": file_digest(start_path)} | ({"dtype": dtype} if model else {}) | \
        ({"tp": args.tp} if args.tp != 1 else {})  # absent at 1: states saved before --tp resume
    torch.manual_seed(args.seed)
    with Database(args.db) as db, measurer(db, spec, args, source) as measure:
        # a replay can only tune on problems it holds rows of
        problems, note = select(split, args.problems, args.seed, model or keyed,
                                (lambda p: bool(measure.pool.offers(p))) if args.replay else None)
        if args.replay and not problems:
            raise FinetuneError(nothing_held(args.replay, spec.name, split, model, bool(keyed)))
        if note:
            print(f"gnn-policy finetune: {note}", file=sys.stderr, flush=True)
        too_much = (model or keyed) and budget_error(args.budget, len(problems), f"{model.name}'s distinct GEMMs tuned"
                                                     if model else "the --keys a replay holds")
        if too_much:
            raise FinetuneError(too_much)
        budget.cap = PER_PROBLEM * len(problems)
        if args.snapshot:
            load_shipped(db)
        state = _resume_state(state_path, plan, db.high_water()[0])
        earlier = db.count_since(spec.name, source, 0) - db.count_since(spec.name, source, state["since"])
        if not args.snapshot and earlier:
            raise FinetuneError(f"--no-snapshot: {args.db} already holds {earlier} {source} rows of {spec.name}, "
                                "which the run would learn from: give it a new --db")
        # after the refusals, and only with rounds left: a finished run re-entered logs no second run
        tracker = _tracker(args, spec.name) if args.wandb and state["round"] < args.rounds else None
        budget.spent_seconds = state["spent_seconds"]  # read before the save below writes the budget's figure
        # kept with the state, so that a resumed or re-run run's card reports every round's, not this call's
        norms: dict[str, list[float]] = state.setdefault("norms", {})
        _save_state(state_path, state, budget)  # before the first measurement: `since` must survive a kill
        # a resumed run continues from its own adapted weights, not from the starting checkpoint
        # (a state written before `rounds_path` existed kept them in `weights`)
        # what the start picks, before its weights adapt in place: the baseline of the measured winners
        starts = start_picks(start_policy, problems, spec, measure.pool.offers if args.replay else None) \
            if source == "real" else {}
        policy = Policy.load(rounds_path if rounds_path.exists() else weights) if state["round"] else start_policy
        adapter = Adapter(policy, args.plan)
        stopped = on_interrupt(lambda: f"{db.count_since(spec.name, source, state['since'])} measurements of this "
                                       f"run stored in {args.db}; run the same command again to resume (it spends "
                                       "only what is left of the budget)")
        with stopped:
            for rnd in range(state["round"], args.rounds):
                rng = random.Random(f"{args.seed}:{rnd}")
                measured = measure_round(policy, problems, spec, measure, budget, args.rounds - rnd, rng,
                                         lambda: _save_state(state_path, state, budget), state["since"], rnd,
                                         served=bool(model or keyed))
                adapter.round(problems, spec, db, source, measured, norms)
                out.mkdir(parents=True, exist_ok=True)
                save_checkpoint(policy.model, rounds_path, policy.members)
                state["round"] = rnd + 1
                _save_state(state_path, state, budget)
                if tracker is not None:
                    tracker.log({"finetune/round": rnd + 1,
                                 "finetune/spent": db.count_since(spec.name, source, state["since"]),
                                 **{f"finetune/grad_norm_{k}": v[-1] for k, v in norms.items() if v}})
            # the tuning problems are the ones the user serves: their best measured configs are kept
            # for `top_k` to pick first, whichever weights the guard keeps (a simulation measured nothing)
            wins = winners(start_policy, problems, spec, db, source) if source == "real" else {}
            figures = {key: db.tflops(spec.name, key, source) for key in wins}
            failed = db.failed_configs(spec.name, source)
            memory = start_policy.measured | {spec.name: start_policy.measured.get(spec.name, {}) | wins}
            if args.guard and "guard" not in state:
                start = Policy.load(start_path)
                check = cross_fit(start, problems, spec, db, source, args.plan, args.rounds, args.seed)
                state["guard"] = dataclasses.asdict(check) | {"kept": check.kept}
                if check.kept == "start":
                    save_checkpoint(start.model, weights, start.members, memory)
                elif check.kept == "calibrated":
                    calibrated = calibrated_only(start, problems, spec, db, source, args.plan, args.rounds, args.seed)
                    save_checkpoint(calibrated.model, weights, calibrated.members, memory)
                else:
                    save_checkpoint(policy.model, weights, policy.members, memory)
                _save_state(state_path, state, budget)
            elif not args.guard:
                save_checkpoint(policy.model, weights, policy.members, memory)
        budget.spent_count = db.count_since(spec.name, source, state["since"])
    card = {"job": "finetune", "gpu": spec.name, "source": source, "checkpoint": weights.name,
            "args": dataclasses.asdict(args), "spent_measurements": budget.spent_count,
            "spent_seconds": round(budget.spent_seconds, 1), "problems": [p.key for p in problems],
            "grad_norm_mean": {k: round(sum(v) / len(v), 5) if v else None for k, v in norms.items()},
            "measured_winners": {key: {"config": c, "tflops": round(tf, 2), "start_pick": starts.get(key),
                                       "start_tflops": _rounded(figures.get(key, {}).get(starts.get(key))),
                                       "start_failed": starts.get(key) in failed.get(key, ())}
                                 for key, (c, tf) in wins.items()},
            "guard": state.get("guard"), "model": model.record(problems) if model else None}
    write_text(out / f"{name}.card.json", json.dumps(card, indent=1) + "\n")
    if tracker is not None:
        kept = (state.get("guard") or {}).get("kept", "adapted")
        tracker.summary.update({"finetune/spent": budget.spent_count, "finetune/kept_adapted": kept == "adapted",
                                **{f"finetune/grad_norm_mean_{k}": v for k, v in card["grad_norm_mean"].items()}})
        tracker.finish()
    return card


def _rounded(tflops: float | None) -> float | None:
    return None if tflops is None else round(tflops, 2)


def winners(policy, problems: list, spec, db, source: str) -> dict[str, tuple[str, float]]:
    """Problem key -> (config key, TFLOP/s) of the best correct config measured on this GPU for
    each problem, among those the policy can pick (its space, today's validity rules)."""
    from gnn_policy.measure.result import CUBLAS
    from training.guard import usable

    out = {}
    for p in problems:
        figures = {k: v for k, v in db.tflops(spec.name, p.key, source).items() if k != CUBLAS}
        configs = usable(policy, p, spec, figures)
        if configs:
            best = max(configs, key=lambda c: figures[c.key])
            out[p.key] = (best.key, figures[best.key])
    return out


def _tracker(args: FinetuneArgs, gpu: str):
    """The run's offline W&B run, grouped by target GPU so the transfer dashboards line methods up."""
    from training.tracking import wandb_run

    return wandb_run(Path(args.log_dir), job_type="finetune", group=args.group or f"transfer-{gpu}",
                     tags=args.tags, config=dataclasses.asdict(args))


def _resume_state(path: Path, plan: dict, high_water: int) -> dict:
    """The saved state of this run, or a fresh one; a state of a run with other settings is refused."""
    if not path.exists():
        return {"plan": plan, "since": high_water, "round": 0, "spent_seconds": 0.0}
    state = json.loads(path.read_text())
    # a state saved before --replay, ADAPT_VERSION or --model existed lacks their keys
    if {"replay": "", "adapt": 1, "model": "", "tokens": "", "model_digest": "", "keys": "", **state["plan"]} != plan:
        raise FinetuneError(f"{path} belongs to a run with {state['plan']}, not {plan}: finish that run with "
                            "the same flags, or give another --output")
    return state


def _save_state(path: Path, state: dict, budget: Budget) -> None:
    state["spent_seconds"] = budget.spent_seconds
    write_text(path, json.dumps(state))

