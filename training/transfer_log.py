"""The picks of every finished (method, budget, seed) run of `gnn-policy transfer`, kept in a
JSON-lines file beside its report, so a re-run on another machine (a fresh GPU lease, with an
empty --work) goes on from the runs already done instead of fine-tuning them again.

Each line carries a fingerprint of what its picks depend on (see `transfer_picks.run_settings`);
a run is reused only under the same fingerprint. Lines of other settings stay in the file, unused.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


def fingerprint(settings: dict) -> str:
    """A digest of the settings (JSON-serialisable)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    """A digest of a file's contents: a checkpoint or model a run's picks depend on."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


class TransferLog:
    """Finished runs' picks (problem key -> the picked config keys), by fingerprint and run, and
    for a fine-tune which weights its guard kept ("adapted", "calibrated", "start" or "unjudged")."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.runs: dict[tuple[str, str, int | None, int], dict] = {}
        self.damaged = 0  # lines that do not parse: cut short by a kill, or mangled by a merge
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    self.runs[entry["settings"], entry["method"], entry["budget"], entry["seed"]] = \
                        {"picks": entry["picks"], "kept": entry.get("kept")}
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.damaged += 1

    def get(self, settings: str, method: str, budget: int | None, seed: int) -> dict[str, list] | None:
        entry = self.runs.get((settings, method, budget, seed))
        return entry["picks"] if entry else None

    def kept(self, settings: str, method: str, budget: int | None, seed: int) -> str | None:
        """Which weights a fine-tune's guard kept; None for other runs and lines written before the guard."""
        return (self.runs.get((settings, method, budget, seed)) or {}).get("kept")

    def add(self, settings: str, method: str, budget: int | None, seed: int, picks: dict[str, list],
            kept: str | None = None) -> None:
        """Record a finished run: one appended line, so a kill mid-write costs at most that line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"settings": settings, "method": method, "budget": budget, "seed": seed, "picks": picks}
        line = json.dumps(entry | ({"kept": kept} if kept else {}))
        cut = self.path.exists() and self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n")
        with self.path.open("a") as f:
            f.write(("\n" if cut else "") + line + "\n")  # a line cut short stays alone, and is skipped
        self.runs[settings, method, budget, seed] = {"picks": picks, "kept": kept}
