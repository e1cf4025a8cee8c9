"""The fine-tune's adaptation: the gradient steps it takes after each round of measurements.

What moves is the strategy (`AdaptPlan.strategy`):
- `whole`: every weight. REINFORCE with a per-problem mean baseline on this round's
  measurements (reward log(TFLOP/s / best found), floored at log 0.1; a failed config scores
  log 0.05), plus the pretraining objective (`training.objective`: listwise, failures, the
  cost head's ranking and regression) on everything measured so far on this GPU, as in
  Reptile's inner loop.
- `calibrate`: only the GPU's calibration (`CALIBRATION`): the GPU embedding the model reads
  for it and the last layer of the cost head's efficiency MLP, 257 of about 450,000 weights,
  on the cost head's losses alone (ranking, regression and its listwise loss, as pretrained.pt
  was trained). A new GPU should differ from the ones the policy learned in a few numbers,
  and the roofline already carries its spec; a GEMM's structure did not change.
- `calibrate-whole`: the calibration first, then every weight as `whole`, each round.

Whether the adapted weights are kept is the guard's question (`training.guard`).
"""
from __future__ import annotations

import dataclasses
import math

from gnn_policy.measure.result import CUBLAS

# transfer fingerprints fine-tunes by finetune.ADAPT_VERSION, not by these: a change to any needs a bump there
FAILED_REWARD = math.log(0.05)  # below every correct config's reward, which is clipped at log 0.1
FLOOR_REWARD = math.log(0.1)
# the GPU's embedding (the unknown GPU's row for a GPU the policy never saw: the only row its
# gradient reaches) and the efficiency MLP's output layer
CALIBRATION = ("gpu_embed.weight", "cost_head.2.weight", "cost_head.2.bias")
STRATEGIES = {"whole": ("whole",), "calibrate": ("calibrate",), "calibrate-whole": ("calibrate", "whole")}


@dataclasses.dataclass(frozen=True)
class AdaptPlan:
    """How a fine-tune adapts after each round (stored in its state and card)."""

    strategy: str = "calibrate"  # a key of STRATEGIES; why this one: docs/BENCHMARKS.md, "Adapting the bounded ..."
    steps: int = 5  # whole-network steps a round, as many as Reptile's inner loop takes
    lr: float = 3e-4  # the whole network's Adam learning rate
    calibration_steps: int = 20  # calibration steps a round
    # the calibration's Adam learning rate: on replayed H200 val labels 3e-3 and 1e-2 did worse than 1e-3;
    # adapting the three-seed vote on four replayed slices, 3e-4 lost less than 1e-3 (BENCHMARKS, 2026-12-07)
    calibration_lr: float = 3e-4

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"adaptation strategy {self.strategy!r}: one of {', '.join(STRATEGIES)}")

    @property
    def stages(self) -> tuple[str, ...]:
        return STRATEGIES[self.strategy]


def calibration_parameters(model) -> list:
    """The parameters `calibrate` moves, in CALIBRATION's order."""
    named = dict(model.named_parameters())
    return [named[name] for name in CALIBRATION]


class Adapter:
    """A policy's adaptation across rounds: one Adam per stage, kept from round to round. An
    ensemble adapts each member alone on the same measurements (its own Adams): its vote is
    what a user picks with, so the vote is what adapts and what the guard compares."""

    def __init__(self, policy, plan: AdaptPlan):
        import torch

        from gnn_policy.policy import Policy

        self.policy, self.plan = policy, plan
        # the members' modules themselves, so that the ensemble's vote reads the adapted weights
        self.parts = [Policy(m) for m in (policy.model, *policy.members)] if policy.members else [policy]
        self.optimisers = [{"whole": torch.optim.Adam(part.model.parameters(), lr=plan.lr),
                            "calibrate": torch.optim.Adam(calibration_parameters(part.model), lr=plan.calibration_lr)}
                           for part in self.parts]

    def round(self, problems: list, spec, db, source: str, measured: dict, norms: dict) -> None:
        """The plan's stages after a round whose new measurements are `measured`."""
        for stage in self.plan.stages:
            self.stage(stage, problems, spec, db, source, measured, norms)

    def stage(self, stage: str, problems: list, spec, db, source: str, measured: dict, norms: dict,
              rounds: int = 1) -> None:
        """One stage's steps; `rounds` times as many stand for that many rounds at once (the guard's replay)."""
        for part, optimisers in zip(self.parts, self.optimisers):
            if stage == "calibrate":
                calibrate(part, problems, spec, db, source, optimisers["calibrate"],
                          self.plan.calibration_steps * rounds, norms)
            else:
                adapt(part, problems, spec, db, source, measured, optimisers["whole"], self.plan.steps * rounds, norms)


def _samples(policy, problems: list, spec, db, source: str) -> list[tuple]:
    """(training sample, best TFLOP/s found) of each problem with measurements on this GPU."""
    from training.dataset import measured_sample

    failed = db.failed_configs(spec.name, source)
    out = []
    for p in problems:
        figs = {k: v for k, v in db.tflops(spec.name, p.key, source).items() if k != CUBLAS}
        sample = measured_sample(p, spec, figs, failed.get(p.key, ()), policy.model.space) if figs else None
        out += [(sample, max(figs.values()))] if sample is not None else []
    return out


def calibrate(policy, problems: list, spec, db, source: str, optimiser, steps: int, norms: dict) -> None:
    """`steps` Adam steps of the CALIBRATION parameters on the cost head's losses over all of this
    GPU's measurements of the problems; every other weight stays as it is."""
    import torch

    from training.dataset import collate
    from training.objective import LossWeights, objective

    model = policy.model
    samples = [s for s, _ in _samples(policy, problems, spec, db, source)]
    if not samples:
        return
    batch = collate(samples, model.space, policy.vocab)
    weights = LossWeights(policy=0.0, cost_listwise=3.0)  # what the cost head of pretrained.pt learned on
    params = calibration_parameters(model)
    frozen = [p for p in model.parameters() if all(p is not q for q in params)]
    flags = [p.requires_grad for p in frozen]
    for p in frozen:
        p.requires_grad_(False)  # no gradient is computed for them, so nothing else can move
    model.train()
    try:
        for _ in range(steps):
            optimiser.zero_grad()
            loss = objective(model, batch, None, weights)[0]
            loss.backward()
            norms.setdefault("calibration", []).append(
                float(torch.sqrt(sum((p.grad ** 2).sum() for p in params if p.grad is not None))))
            optimiser.step()
    finally:
        for p, flag in zip(frozen, flags):
            p.requires_grad_(flag)
        model.eval()


def adapt(policy, problems: list, spec, db, source: str, measured: dict, optimiser, steps: int, norms: dict) -> None:
    """REINFORCE on this round's measurements plus the pretraining objective (`training.objective`:
    listwise, failures, the cost head) on all of this GPU's, as Reptile's inner loop adapts."""
    import torch

    from gnn_policy.space import TileConfig
    from training.dataset import collate
    from training.objective import LossWeights, objective

    model, space_ = policy.model, policy.model.space
    found = _samples(policy, problems, spec, db, source)
    samples, reinforce = [s for s, _ in found], []
    for sample, best in found:
        p = sample.problem
        new = measured.get(p.key, {})
        if len(new) > 1:
            rewards = [max(FLOOR_REWARD, math.log(v / best)) if v else FAILED_REWARD for v in new.values()]
            reinforce.append((p, [space_.index(TileConfig.from_key(k)) for k in new], rewards))
    batch = collate(samples, space_, policy.vocab) if samples else None
    model.train()
    for _ in range(steps if samples else 0):
        pg_total = torch.zeros(())
        for p, new_idx, rewards in reinforce:
            h, mask = policy.encode(p, spec)
            r = torch.tensor(rewards)
            logp = model.log_prob(h, torch.tensor(new_idx)[None], mask)[0]
            pg_total = pg_total + -((r - r.mean()) * logp).mean()
        # summed over problems like the REINFORCE term, so the two keep their balance at any problem count
        sl_total = objective(model, batch, None, LossWeights())[0] * len(samples)
        optimiser.zero_grad()
        for name, loss in (("reinforce", pg_total), ("supervised", sl_total)):
            if loss.requires_grad:
                grads = torch.autograd.grad(loss, [q for q in model.parameters() if q.requires_grad],
                                            retain_graph=True, allow_unused=True)
                norms.setdefault(name, []).append(
                    float(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None))))
        (pg_total + sl_total).backward()
        optimiser.step()
    model.eval()
