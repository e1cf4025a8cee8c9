"""`gnn-policy ensemble`: checkpoints of one recipe (seeds) joined into one policy checkpoint.

The first member scores every valid config of a problem, as a single policy does; the others
rescore its best `policy.VOTE` and the mean of the members decides (`Policy._vote`). Seeds
of one recipe differ by as much as a doubling of the data (docs/BENCHMARKS.md, "More data or
another seed?"), and their mean picks better than the mean seed; rescoring the head only keeps
a new shape within the latency target, where scoring everything three times did not.

The card lists the members' cards; the calibration is not carried over (the ensemble's
predictions are its own): fit it with `python -m gnn_policy.benchmarks.calibrate`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gnn_policy.atomic import write_text
from gnn_policy.args import flag


class EnsembleError(ValueError):
    """The members cannot make one ensemble; the message names the member and why."""


@dataclasses.dataclass(frozen=True)
class EnsembleArgs:
    """Join checkpoints of one model config (seeds of one recipe) into one ensemble checkpoint."""

    out: str = flag(help="the ensemble checkpoint to write (its card beside it)")
    member: tuple[str, ...] = flag((), "a checkpoint to join (repeat: at least two); the first one scores every "
                                       "config, the others rescore its favourites", action="append")


def run(args: EnsembleArgs) -> dict:
    from gnn_policy.policy import Policy, save_checkpoint

    if len(args.member) < 2:
        raise EnsembleError(f"an ensemble needs at least two --member checkpoints, got {len(args.member)}")
    out = Path(args.out)
    if any(Path(m).resolve() == out.resolve() for m in args.member):
        raise EnsembleError(f"--out {out} is one of the members: write the ensemble to a new file")
    policies = [Policy.load(m) for m in args.member]
    models = []
    for path, policy in zip(args.member, policies):
        if policy.members:
            raise EnsembleError(f"{path} is an ensemble already: join its members' own checkpoints")
        if policy.model.cfg != policies[0].model.cfg:
            diff = sorted(k for k, v in dataclasses.asdict(policy.model.cfg).items()
                          if dataclasses.asdict(policies[0].model.cfg)[k] != v)
            raise EnsembleError(f"{path}: its model config differs from {args.member[0]}'s in {', '.join(diff)}")
        models.append(policy.model)
    save_checkpoint(models[0], out, models[1:])
    card = {"checkpoint": out.name, "job": "ensemble", "members": [_card(Path(m)) for m in args.member],
            "model_config": dataclasses.asdict(models[0].cfg)}
    card_path = out.with_name(out.stem + ".card.json")
    write_text(card_path, json.dumps(card, indent=1) + "\n")
    return {"checkpoint": str(out), "card": str(card_path), "members": list(args.member)}


def _card(checkpoint: Path) -> dict:
    """A member's card (its training job, data and arguments), or its file name when it has none."""
    path = checkpoint.with_name(checkpoint.stem + ".card.json")
    if not path.exists():
        return {"checkpoint": checkpoint.name}
    return {"checkpoint": checkpoint.name, **{k: v for k, v in json.loads(path.read_text()).items() if k != "checkpoint"}}
