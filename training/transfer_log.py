"""The picks of every finished (method, budget, seed) run of `gnn-policy transfer`, kept in a
JSON-lines file beside its report, so a re-run on another machine (a fresh GPU lease, with an
empty --work) goes on from the runs already done instead of fine-tuning them again.

A run is reused only under the same settings: target, split, label source, evaluated problems,
fine-tune settings and the bytes of the checkpoints and analytic model. Lines of other settings
stay in the file and are ignored.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


def fingerprint(settings: dict, files: list[str | Path]) -> str:
    """A digest of the settings and of the files' contents."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for f in files:
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:16]


class TransferLog:
    """Finished runs' picks (problem key -> TFLOP/s of the picks) under one fingerprint."""

    def __init__(self, path: str | Path, settings: str):
        self.path, self.settings = Path(path), settings
        self.runs: dict[tuple[str, int | None, int], dict[str, list]] = {}
        self.ignored = 0
        if self.path.exists():
            text = self.path.read_text()
            if not text.endswith("\n"):  # a line cut short by a kill: drop it, so appends start clean
                text = text[:text.rfind("\n") + 1]
                self.path.write_text(text)
            for line in text.splitlines():
                entry = json.loads(line)
                if entry["settings"] != settings:
                    self.ignored += 1
                    continue
                self.runs[entry["method"], entry["budget"], entry["seed"]] = entry["picks"]

    def get(self, method: str, budget: int | None, seed: int) -> dict[str, list] | None:
        return self.runs.get((method, budget, seed))

    def add(self, method: str, budget: int | None, seed: int, picks: dict[str, list]) -> None:
        """Record a finished run; one appended line, so a kill mid-write costs at most that line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"settings": self.settings, "method": method, "budget": budget, "seed": seed,
                           "picks": picks})
        with self.path.open("a") as f:
            f.write(line + "\n")
        self.runs[method, budget, seed] = picks
