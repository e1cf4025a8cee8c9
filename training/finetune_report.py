"""What a fine-tune bought, for the person who ran it: each tuned GEMM's start pick against the
best config measured for it (the one the written checkpoint picks first there), as the table
`gnn-policy finetune` prints (`--json` prints the card instead).
"""
from __future__ import annotations

import math
from pathlib import Path


def start_picks(policy, problems: list, spec, offers=None) -> dict[str, str]:
    """Problem key -> the config key the starting policy picks first: `top_k`'s, or by its
    first-pick rule among the configs a replay `offers` for the problem."""
    out = {}
    for p in problems:
        if offers is None:
            picks = policy.top_k(p, spec, 1)
            if picks:
                out[p.key] = picks[0].config.key
            continue
        from training.adapt_replay import ranked_among

        ranked = ranked_among(policy, p, spec, offers(p))
        if ranked:
            out[p.key] = ranked[0].key
    return out


def table(card: dict) -> str:
    """The card as a person reads it: one row per tuned GEMM, then where the checkpoint is."""
    guard = card.get("guard")
    kept = "adapted (no guard)" if guard is None else f"{guard['kept']} (the guard's cross-fit)"
    lines = [f"finetune {card['gpu']} ({card['source']}): {card['spent_measurements']} measurements on "
             f"{len(card['problems'])} GEMMs, {card['spent_seconds']} s of measuring; weights kept: {kept}"]
    wins = card["measured_winners"]
    if not wins:
        lines.append("no measured winners are kept (a simulated run measures nothing real)" if card["source"] != "real"
                     else "no GEMM got a correct measurement: its picks stay the policy's")
    else:
        rows = [("GEMM", "start pick", "TFLOP/s", "best measured", "TFLOP/s", "gain")]
        gains = []
        for key in card["problems"]:
            win = wins.get(key)
            if win is None:
                rows.append((key, "-", "-", "not measured", "-", "-"))
                continue
            start = win.get("start_tflops")
            gain = win["tflops"] / start if start else None
            if gain is not None:
                gains.append(gain)
            shown = f"{start:.1f}" if start else "failed" if win.get("start_failed") else "not measured"
            rows.append((key, win.get("start_pick") or "-", shown,
                         win["config"], f"{win['tflops']:.1f}", f"{gain:.2f}x" if gain is not None else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        if gains:
            geo = math.exp(sum(map(math.log, gains)) / len(gains))
            lines.append(f"geomean gain over the {len(gains)} GEMMs whose start pick was measured: {geo:.3f}x")
    path = Path(card["args"]["output"]) / card["checkpoint"]
    use = (f"; its measured winners are picked first on {card['gpu']} by `gnn-policy tune --checkpoint {path}`, "
           f"`GNN_POLICY_CHECKPOINT={path}` and `gnn_policy.patch(model, checkpoint=\"{path}\")`" if wins else "")
    lines.append(f"checkpoint: {path} (card beside it){use}")
    return "\n".join(lines)
