"""What each method of `gnn-policy transfer` picks on the target: a policy's top 8 after its
fine-tune (`training.finetune`), a search's best found, the analytic model's ranking or a named
list's best; and the fingerprints that say when a finished run or fine-tune may be reused.

`served` is the plain checkpoint fine-tuned as a user runs `finetune --keys` on the GEMMs they
serve: its B measurements in all go to the evaluated problems themselves, as a search's do, and
its first pick on a problem is the best config it measured there (`Policy.measured`), else its
adapted pick. The other fine-tunes never see the evaluated problems, so theirs is the
generalisation figure and `served`'s what a user's own problems get.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

from graphs import GemmProblem
from training.finetune import ADAPT_VERSION, FinetuneArgs
from training.transfer_args import POLICIES, SPEC_ONLY, TransferArgs
from training.transfer_log import fingerprint

PICKS_VERSION = 1  # raise when the code that makes picks changes (top_k's rule, searches, named lists)
LISTS = SPEC_ONLY[1:]  # the named config lists, timed in full


def run_settings(args: TransferArgs, method: str, target: str, source: str, problems, space_,
                 digests: dict[str, str], tune: dict) -> str:
    """A fingerprint of what this run's picks depend on beyond (method, budget, seed): a fine-tune's
    `finetune_settings` (`tune`, empty for the rest), a checkpoint's or the analytic model's bytes
    only where used."""
    settings = {"version": PICKS_VERSION, "target": target, "split": args.split, "source": source,
                "problems": [p.key for p in problems], "runner": args.runner, "timeout": args.timeout,
                "space": [space_.name, space_.knobs]}
    if args.replay:  # labels from these stored rows, candidates among them
        settings["replay"] = digests["replay"]
    if method in POLICIES:
        settings["checkpoint"] = digests["meta" if method == "meta" else "plain"]  # scratch, served: plain's
        settings.update(tune)
    elif method == "analytic":
        settings["analytic"] = digests["analytic"]
    return fingerprint(settings)


def finetune_settings(args: TransferArgs, method: str, target: str, source: str, space_,
                      digests: dict[str, str], problems: list[GemmProblem]) -> dict:
    """What a fine-tune's weights depend on: not the evaluation's split or problems (but for
    `served`, which tunes on them), so another evaluation reuses a finished fine-tune. Its keys
    agree with `run_settings`' where both have them."""
    tuned = {"tune_problems": [p.key for p in problems]} if method == "served" else {
        "tune_problems": args.tune_problems,
        # absent at its default: fine-tunes finished before --tune-split existed are reused
        **({"tune_split": args.tune_split} if args.tune_split != "train" else {})}
    out = {"version": PICKS_VERSION, "target": target, "source": source, "runner": args.runner,
           "timeout": args.timeout, "space": [space_.name, space_.knobs],
           "checkpoint": digests["meta" if method == "meta" else "plain"], **tuned,
           "rounds": args.rounds, "strategy": args.strategy, "steps": args.steps, "lr": args.lr,
           "adapt": ADAPT_VERSION}
    if args.simulate:  # the fine-tune's labels come from the analytic model
        out["analytic"] = digests["analytic"]
    if args.replay:
        out["replay"] = digests["replay"]
    return out


def method_picks(args: TransferArgs, method: str, budget: int | None, seed: int, spec, problems, measure,
                 analytic, space_, tune: str, plain_digest: str,
                 offered: Callable[[GemmProblem], set[str]] | None = None) -> tuple[dict[str, list], str | None]:
    """Problem key -> config keys of the method's picks (top-1 first; a search's or a list's best
    found alone, None if nothing worked), and for a fine-tune which weights its guard kept.
    Every problem is searched at once, so each step's configs compile together. With `offered`
    (a replay's stored config keys of a problem) every method chooses among those alone: a
    policy's top 8 in `Policy.top_k`'s order, a search's and the analytic model's candidates,
    the named lists' members."""
    from gnn_policy.search import evolutionary_search, fixed_list, given, random_search, run_searches, valid_configs
    from gnn_policy.space import NAMED_LISTS

    policy, kept = _adapted(args, method, budget, seed, spec, tune, plain_digest, problems) \
        if method in POLICIES else (None, None)
    searches = []
    for p in problems:
        rng = random.Random(f"{seed}:{method}:{p.key}")
        keys = offered(p) if offered is not None else None
        if policy is not None:
            searches.append((p, given(_top8(policy, p, spec, keys))))
            continue
        valid = valid_configs(space_, spec, p)
        if keys is not None:
            valid = [c for c in valid if c.key in keys]
        if method == "analytic":
            scores = analytic.predict_tflops(p, valid, spec)
            search = given([valid[i] for i in sorted(range(len(valid)), key=lambda i: -scores[i])[:8]])
        elif method == "random":
            search = random_search(valid, budget, rng)
        elif method == "evolutionary":
            search = evolutionary_search(valid, space_, budget, rng)
        else:
            named = NAMED_LISTS[method]
            search = fixed_list([c for c in named if keys is None or c.key in keys], spec, p, len(named))
        searches.append((p, search))
    out = {}
    for (p, _), trace in zip(searches, run_searches(searches, measure)):
        if method in POLICIES or method == "analytic":
            out[p.key] = [c.key for c, _ in trace]
        else:
            found = [(v, c.key) for c, v in trace if v is not None]
            out[p.key] = [max(found)[1]] if found else [None]
    return out, kept


def _top8(policy, problem, spec, keys: set[str] | None) -> list:
    """The policy's first 8 picks, among `keys` alone when given (what a replay can answer); as
    `Policy.top_k`, a config its fine-tune measured best for the problem comes first."""
    if keys is None:
        return [pick.config for pick in policy.top_k(problem, spec, 8)]
    from training.adapt_replay import ranked_among

    order = ranked_among(policy, problem, spec, keys)
    known = policy.measured.get(spec.name, {}).get(problem.key)
    won = [c for c in order if known and c.key == known[0]]
    return (won + [c for c in order if c not in won])[:8]


def _adapted(args: TransferArgs, method: str, budget: int, seed: int, spec, tune: str, plain_digest: str,
             problems: list[GemmProblem]):
    """The method's policy after fine-tuning on `budget` measurements of the target. Its folder
    in --work is named by `tune`, the fingerprint of `finetune_settings`: a fine-tune resumes
    or is reused under the same ones (another evaluation split or problem count included), and
    new fine-tune flags, a new checkpoint or a new ADAPT_VERSION start afresh. Also says which
    weights the fine-tune's guard kept: adapted, calibrated (the calibration alone), start, or
    unjudged (the start, for want of held-out problems with enough measured configs); None at B = 0.
    `served` tunes on `problems`, the evaluated ones, as `finetune --keys`."""
    from gnn_policy.policy import Policy
    from training.finetune import run as finetune

    work = Path(args.work)
    scratch = work / f"scratch-s{seed}-{plain_digest[:8]}.pt"  # a new --plain, a new architecture
    start = _scratch(Path(args.plain), scratch, seed) if method == "scratch" else \
        Path(args.meta if method == "meta" else args.plain)
    if budget == 0:
        return Policy.load(start), None
    name = f"{method}-B{budget}-s{seed}-{tune[:8]}"
    served = method == "served"
    card = finetune(FinetuneArgs(
        gpu=spec.name, budget=str(budget), db=str(work / f"{name}.sqlite"), checkpoint=str(start),
        output=str(work / name), split="" if served else args.tune_split,
        keys=",".join(p.key for p in problems) if served else "",
        problems=len(problems) if served else args.tune_problems, rounds=args.rounds,
        strategy=args.strategy, steps=args.steps, lr=args.lr, simulate=args.simulate, analytic=args.analytic, seed=seed, timeout=args.timeout,
        runner=args.runner, replay=args.replay,
        snapshot=False, log_dir=str(work / "wandb"), group=f"transfer-{spec.name}",
        tags=(f"method={method}", f"budget={budget}", f"seed={seed}"), wandb=args.wandb))
    guard = card["guard"]
    # a guard that scored nothing fell back for want of evidence, not because the adaptation lost
    kept = "adapted" if guard is None else guard["kept"] if guard["scored"] else "unjudged"
    return Policy.load(work / name / card["checkpoint"]), kept


def _scratch(plain: Path, path: Path, seed: int) -> Path:
    """A randomly initialised policy with the plain checkpoint's architecture, saved once per seed."""
    import torch

    from gnn_policy.model import PolicyModel
    from gnn_policy.policy import Policy, save_checkpoint

    if not path.exists():
        config = Policy.load(plain).model.cfg
        torch.manual_seed(seed)
        save_checkpoint(PolicyModel(config), path)
    return path
