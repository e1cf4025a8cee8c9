"""What a fine-tune may spend: a count of measurements or a measuring time (`--budget`), and
the most measurements one run may take per tuning problem."""
from __future__ import annotations

import argparse
import dataclasses
import re


# Most measurements per tuning problem in one run: the adaptation's listwise and ranking losses
# compare a problem's configs pairwise, so its memory grows with their square (measured on the
# CPU: 2,000 configs of one problem took 0.6 GB, 20,000 took 13 GB).
PER_PROBLEM = 2048


class FinetuneError(RuntimeError):
    """The run cannot start: GPU mismatch, no GPU, a bad budget."""


def budget_text(text: str) -> str:
    """--budget's check (the text is what the run's state records)."""
    try:
        Budget.parse(text)
    except FinetuneError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--budget {text!r}: ")) from None
    return text


@dataclasses.dataclass
class Budget:
    """What may be spent (a count or seconds) and what was; persisted in the resume state."""

    count: int | None = None
    seconds: float | None = None
    spent_count: int = 0
    spent_seconds: float = 0.0
    cap: int = 10**9  # a time budget's most measurements: what the adaptation holds (`PER_PROBLEM`)

    @classmethod
    def parse(cls, text: str) -> Budget:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
        if not m or (not m.group(2) and "." in m.group(1)):
            raise FinetuneError(f"--budget {text!r}: give a number of measurements (64) or a time (10m, 90s, 1h)")
        if float(m.group(1)) == 0:
            raise FinetuneError(f"--budget {text!r}: nothing to spend; give at least 1 measurement or a time")
        if not m.group(2):
            return cls(count=int(m.group(1)))
        return cls(seconds=float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)])

    def left(self) -> int:
        """Measurements that may still start (a time budget allows up to `cap` until it is spent)."""
        if self.count is not None:
            return max(0, self.count - self.spent_count)
        return max(0, self.cap - self.spent_count) if self.spent_seconds < self.seconds else 0


def budget_error(budget: str, problems: int, what: str) -> str:
    """Why a count budget is too large for `problems` tuning problems ('' when it fits)."""
    count = Budget.parse(budget).count
    if count is None or count <= PER_PROBLEM * problems:
        return ""
    return (f"--budget {count}: at most {PER_PROBLEM} measurements per tuning problem, {PER_PROBLEM * problems} "
            f"for {problems} ({what}); more would not fit in the adaptation's memory")
