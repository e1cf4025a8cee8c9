"""The flags of `gnn-policy transfer`, and the checks made before it runs: a held-out target
that neither checkpoint nor the analytic model saw, and per-target report and work folders."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gnn_policy.args import at_least, flag, int_list, one_of, positive
from gnn_policy.collect import SPLIT_NAMES
from gnn_policy.database import DEFAULT_PATH
from gnn_policy.measure.workers import runner_path
from training.adaptation import STRATEGIES
from training.finetune import FinetuneArgs
from training.finetune_budget import PER_PROBLEM

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
# the experiment's methods, in the report's order (`training.transfer_picks` makes their picks)
POLICIES = ("meta", "plain", "scratch", "served")
SEARCHES = ("random", "evolutionary")
SPEC_ONLY = ("analytic", "triton_tutorial", "inductor_mm")
METHODS = (*POLICIES, *SEARCHES, *SPEC_ONLY)


class TransferError(RuntimeError):
    """The experiment cannot be run as asked: a checkpoint or model that saw the target."""


@dataclasses.dataclass(frozen=True)
class TransferArgs:
    """Adapt meta, plain and from-scratch policies to a held-out GPU at several budgets; compare with baselines."""

    target: str = flag("", "the held-out GPU: h200, or a slice of the local one (h200-sm48); required "
                           "unless --report-only")
    plain: str = flag("", "plain pretrained checkpoint trained without the target (the shipped "
                          "pretrained.pt saw the H200); required unless --report-only")
    budgets: str = flag("0,16,32,64,128,256", "total measurements on the target, comma-separated",
                        check=int_list(0))
    seeds: str = flag("0", "seeds, comma-separated (fine-tune choices, scratch weights, searches)", check=int_list(0))
    meta: str = flag(str(CHECKPOINTS / "meta.pt"), "meta-pretrained checkpoint, trained without the target")
    analytic: str = flag(str(CHECKPOINTS / "analytic-slices.json"), "analytic model, fitted without the target "
                                                                    "(the default: on H200 slices only)")
    db: str = flag(str(DEFAULT_PATH), "database holding best known on the target; evaluation picks are stored "
                                      "here (--simulate uses a database of its own under --work)")
    split: str = flag("test", "split evaluated on: test to report, val to choose fine-tune settings without it",
                      check=one_of(*SPLIT_NAMES))
    problems: int = flag(40, "the split's first N problems in collection order (for test, a dense sweep's), "
                             "those measured on the target, to evaluate on (0: the whole split)", check=at_least(0))
    tune_problems: int = flag(8, "problems of --tune-split each fine-tune spends its budget on", check=at_least(1))
    tune_split: str = flag("train", "split the fine-tunes tune on (random-train with a random evaluation split); "
                                    "never the evaluated one", check=one_of(*SPLIT_NAMES))
    rounds: int = flag(4, "fine-tune rounds", check=at_least(1))
    strategy: str = flag(FinetuneArgs.strategy, "what the fine-tunes adapt (finetune's --strategy and default)",
                         check=one_of(*STRATEGIES))
    steps: int = flag(FinetuneArgs.steps, "gradient steps per fine-tune round (finetune's default)", check=at_least(0))
    lr: float = flag(FinetuneArgs.lr, "learning rate of the fine-tunes (finetune's default)", check=positive)
    methods: str = flag("", "methods to run, comma-separated (empty: all): meta, plain, scratch, served (plain "
                            "fine-tuned on the evaluated problems themselves, as finetune --keys), random, "
                            "evolutionary, analytic, triton_tutorial, inductor_mm")
    simulate: bool = flag(False, "label everything with the analytic model (CPU dry run)")
    replay: str = flag("", "answer every measurement from the target's real rows stored in this database (a CPU "
                           "run on real labels): every method chooses among a problem's stored configs, best "
                           "known is the best of them, fine-tunes tune on the stored train-split problems")
    runner: str = flag("gnn_policy.measure.runner:measure_configs", "measuring function (package.module:function)",
                       check=runner_path)
    timeout: float = flag(120.0, "seconds a config may take on the GPU before it is a timeout", check=positive)
    work: str = flag("", "folder of the fine-tunes' databases, checkpoints and W&B runs (default: "
                         "runs/transfer/<target>)")
    out: str = flag("", "folder for transfer.csv, transfer.md, transfer.png and runs.jsonl (default: "
                        "docs/data/transfer/<target>)")
    wandb: bool = flag(True, "log to W&B (offline unless WANDB_MODE is set)", off="write no W&B run")
    time_limit: float = flag(0.0, "minutes after which no further (method, budget, seed) run starts (the first "
                                  "always does): what was measured is kept, the finished runs are reported in "
                                  "transfer.partial.*, and a re-run goes on from there", check=at_least(0, float))
    shard_dir: str = flag("", "after each (method, budget, seed) run, write the evaluation measurements added "
                              "since the last export to a new shard here (e.g. data/measurements), so a fresh "
                              "machine can resume")
    report_only: bool = flag(False, "run nothing: rebuild transfer.md, transfer.png and the W&B runs from the "
                                    "transfer.csv in --out (written on a GPU machine without wandb, say)")

    def __post_init__(self) -> None:
        unknown = [m for m in self.chosen_methods() if m not in METHODS]
        if unknown:
            raise ValueError(f"--methods: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not one of "
                             + ", ".join(METHODS))
        if self.tune_split == self.split:  # the tuned problems would be among those scored
            raise ValueError(f"--tune-split {self.tune_split} is the split evaluated: tune on another")
        if self.replay and self.simulate:
            raise ValueError("--replay answers from stored real rows, --simulate from the analytic model: choose one")
        most = max(int(b) for b in self.budgets.split(","))
        if most > PER_PROBLEM * self.tune_problems:  # each fine-tune would refuse it, after the runs before it
            raise ValueError(f"--budgets {most}: a fine-tune measures at most {PER_PROBLEM} per tuning problem, "
                             f"{PER_PROBLEM * self.tune_problems} for {self.tune_problems} (--tune-problems)")


    def chosen_methods(self) -> list[str]:
        """--methods as a list (every method when empty)."""
        return [m.strip() for m in self.methods.split(",") if m.strip()] or list(METHODS)


def seen_gpus(path: str | Path) -> tuple[str, ...]:
    """The GPUs a checkpoint has an embedding for: those it was trained on. The whole policy is
    loaded, so a file that is not one is refused before the experiment starts."""
    from gnn_policy.policy import Policy

    return tuple(Policy.load(path).model.cfg.gpu_names)


def check_held_out(args: TransferArgs, target: str) -> None:
    from gnn_policy.measure.simulator import fitted_gpus

    used = [("--meta", args.meta)] if "meta" in args.chosen_methods() else []  # the others start from --plain
    for name, path in used + [("--plain", args.plain)]:
        if not Path(path).exists():
            raise TransferError(f"{name} {path} does not exist")
        if target in seen_gpus(path):
            raise TransferError(f"{name} {path} was trained on {target}, the held-out target: pretrain "
                                f"without it (e.g. gnn-policy pretrain --gpus h200-sm64 ... --out DIR)")
        card = Path(path).with_suffix(".card.json")  # meta.pt -> meta.card.json
        simulator = json.loads(card.read_text()).get("simulator", {}) if card.exists() else {}
        if target in simulator.get("fitted_on", []) and not args.simulate:
            raise TransferError(f"{name} {path} learned from simulated labels of an analytic model fitted on "
                                f"{target}, the held-out target ({card}): refit the model without it and pretrain again")
    if target in fitted_gpus(args.analytic) and not args.simulate:
        raise TransferError(f"--analytic {args.analytic} was fitted on {target}, the held-out target: "
                            "fit it on other GPUs' data")


def with_folders(args: TransferArgs) -> TransferArgs:
    """--out and --work defaulted per target (by its spec name, whatever alias named it), so two
    targets' reports and fine-tunes stay apart."""
    import hardware_specs

    if args.target:
        folder = hardware_specs.load(args.target).name.lower()
    elif args.report_only and args.out:
        folder = Path(args.out).name
    else:
        raise TransferError("give --target (or, with --report-only, --out)")
    folder += "-replay" if args.replay else ""  # replayed runs never mix with measured ones
    return dataclasses.replace(args, out=args.out or f"docs/data/transfer/{folder}",
                               work=args.work or f"runs/transfer/{folder}")
