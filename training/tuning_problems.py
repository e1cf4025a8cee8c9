"""The problems `finetune` spends its budget on: a suite split's (`--split`), the distinct
GEMMs of the model a user serves (`--model SPEC --tokens LIST`, expanded as `tune --model`
expands it, by `gnn_policy.model_tune.model_rows`), or GEMMs named by their keys (`--keys`). A computation that several layers or token
counts share is tuned once: the measurements and the adaptation see computations, not layers.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any, Callable

from graphs import GemmProblem
from graphs.random_gemms import SPLITS as RANDOM_SPLITS
from gnn_policy.collect import select_problems
from gnn_policy.model_tune import model_rows
from training.transfer_log import file_digest

# how far into a random split's stream a replay looks for problems it holds: past the 2,500
# random-train problems a collection aims at
REPLAY_HORIZON = 3000


@dataclasses.dataclass(frozen=True)
class ModelProblems:
    """A model's distinct computations, in the order a --problems cap takes them."""

    spec: str  # --model as given
    name: str
    tokens: list[int]  # the token counts expanded (empty for a module whose example inputs set the shapes)
    digest: str  # of the config.json or Python file that defines the model
    problems: list[GemmProblem]
    shared: dict[str, dict[str, list]]  # problem key -> the tokens and layers that run it
    tp: int = 1  # the tensor-parallel degree whose one-GPU share these are

    def record(self, tuned: list[GemmProblem]) -> dict[str, Any]:
        """What the card says of the model: its file's digest and which of its GEMMs were tuned."""
        return {"spec": self.spec, "name": self.name, "tokens": self.tokens, "tp": self.tp, "digest": self.digest,
                "distinct": len(self.problems),
                "tuned": [{"problem": p.key, **self.shared[p.key]} for p in tuned]}


def expand(spec: str, tokens: str, dtype: str, tp: int = 1) -> ModelProblems:
    """SPEC's distinct GEMMs (one GPU's share under `tp`-way tensor parallelism); a bad SPEC raises
    model_config.ConfigError (naming the field) or model_tune.ModelSpecError, before the run
    measures or writes anything."""
    model = model_rows(spec, tokens, dtype, tp)
    shared: dict[str, dict[str, list]] = {}
    by_tokens: dict[int | None, list[GemmProblem]] = {}
    for row in model.rows:
        problem = row["problem"]
        if problem.key not in shared:  # MoE experts' GEMMs can coincide across token counts
            shared[problem.key] = {"tokens": [], "layers": []}
            by_tokens.setdefault(row["tokens"], []).append(problem)
        entry = shared[problem.key]
        if row["tokens"] not in entry["tokens"]:
            entry["tokens"].append(row["tokens"])
        entry["layers"] += [layer for layer in row["layers"] if layer not in entry["layers"]]
    # in turn from each token count, so that a cap still covers every count the user serves; each
    # count's layer order starts one further along, so that the first picks also cover more layers
    rotated = [g[i % len(g):] + g[:i % len(g)] for i, g in enumerate(by_tokens.values())]
    order = [p for group in itertools.zip_longest(*rotated) for p in group if p is not None]
    counts = sorted({row["tokens"] for row in model.rows} - {None})
    return ModelProblems(spec, model.name, counts, file_digest(model.source), order, shared, tp)


def select(split: str, count: int, seed: int, given: ModelProblems | list[GemmProblem] | None,
           offers: Callable[[GemmProblem], bool] | None) -> tuple[list[GemmProblem], str]:
    """At most `count` tuning problems: a split's, or the first of a model's or of --keys' when
    `given`; only those `offers` accepts when given (a replay's stored ones); and a note on
    what was left out ('' when nothing was)."""
    if given is None:
        if split in RANDOM_SPLITS and offers is not None:
            # a replay holds rows of the problems collections drew, seed 0's stream (another seed's
            # stream holds none): the run's seed chooses among them
            held = [p for p in select_problems(split, REPLAY_HORIZON, 0) if offers(p)]
            return random.Random(seed).sample(held, min(count, len(held))), ""
        return select_problems(split, count, seed, where=offers), ""
    model = given if isinstance(given, ModelProblems) else None
    listed = model.problems if model else given
    held = [p for p in listed if offers is None or offers(p)]
    notes = []
    if len(held) < len(listed):
        notes.append(f"the replay holds rows of {len(held)} of " +
                     (f"{model.name}'s {len(listed)} distinct GEMMs" if model else f"the {len(listed)} --keys"))
    if len(held) > count:
        notes.append(f"{model.name} has {len(held)} distinct GEMMs over tokens {_tokens(model)}; tuning on "
                     f"{count} of them (--problems {count}), taken in turn from each token count" if model else
                     f"tuning on the first {count} of {len(held)} --keys (--problems {count})")
    return held[:count], "; ".join(notes)


def nothing_held(replay: str, gpu: str, split: str, model: ModelProblems | None, keyed: bool = False) -> str:
    """Why a replay has nothing to tune on."""
    if keyed:
        return f"--replay {replay} has no rows of {gpu} for any of the --keys: measure them on that GPU first"
    if model is None:
        return f"--replay {replay} has no rows of {gpu} for {split}-split problems"
    return (f"--replay {replay} has no rows of {gpu} for any of {model.name}'s {len(model.problems)} distinct "
            f"GEMMs (tokens {_tokens(model)}): a replay only answers from stored measurements, so measure "
            "them on that GPU first (gnn-policy finetune without --replay), or replay a --split instead of --model")


def _tokens(model: ModelProblems) -> str:
    return ",".join(map(str, model.tokens)) or "set by the example inputs"
