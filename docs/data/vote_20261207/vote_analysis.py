"""Three seeds' vote on val, replayed (CPU): each seed's first pick, the vote over every valid
config and over the first member's best 1,024 / 4,096 / 16,384, and a split-half check of the
vote against choosing a seed on val (choose on a random half, judge on the other; 1,000 halvings).

    python docs/data/vote_20261207/vote_analysis.py /tmp/ev.sqlite h100 random-val out.json \
        s0=/tmp/x/seed0.pt s1=/tmp/x/seed1.pt s2=/tmp/x/seed2.pt
"""
import json
import math
import random
import sys

import torch

import hardware_specs
from graphs.classes import split_of
from gnn_policy.baselines import fits
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import Policy
from gnn_policy.space import TileConfig

db, gpu, split, out = Database(sys.argv[1]), hardware_specs.load(sys.argv[2]), sys.argv[3], sys.argv[4]
pols = {a.split("=")[0]: Policy.load(a.split("=")[1]) for a in sys.argv[5:]}
names = list(pols)
rows = []
for p in [p for p in db.problems(gpu.name) if split_of(p) == split]:
    tf = db.tflops(gpu.name, p.key)
    tf.pop(CUBLAS, None)
    best = max(tf.values())
    space = pols[names[0]].model.space
    ok = fits(space, gpu, p)
    configs = [c for c in map(TileConfig.from_key, tf) if c in space and ok(c)]
    vals = torch.tensor([tf[c.key] for c in configs])
    idx = torch.tensor([space.flat_index(c) for c in configs])
    full = {n: pol.scores(p, gpu).by_flat for n, pol in pols.items()}

    def pick(s):
        return (vals[int(s.argmax())] / best).item()

    row = {n: pick(full[n][idx]) for n in names}
    row["vote:all"] = pick(torch.stack([full[n][idx] for n in names]).mean(0))
    first = full[names[0]]
    valid = torch.isfinite(first)
    for v in (1024, 4096, 16384):
        top = torch.nonzero(valid).flatten()[first[valid].topk(min(v, int(valid.sum()))).indices]
        mean = torch.stack([full[n][top] for n in names]).mean(0)
        s = first + (mean - first[top]).mean()
        s[top] = mean
        row[f"vote:{v}"] = pick(s[idx])
    rows.append(row)


def gm(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


result = {"gpu": gpu.name, "split": split, "problems": len(rows),
          "first_pick": {k: round(gm([r[k] for r in rows]), 4) for k in rows[0]}}
rng = random.Random(0)
chosen, vote, mean_seed = [], [], []
for _ in range(1000):
    order = list(range(len(rows)))
    rng.shuffle(order)
    a, b = order[:len(order) // 2], order[len(order) // 2:]
    best_seed = max(names, key=lambda n: gm([rows[i][n] for i in a]))
    chosen.append(gm([rows[i][best_seed] for i in b]))
    vote.append(gm([rows[i]["vote:4096"] for i in b]))
    mean_seed.append(sum(gm([rows[i][n] for i in b]) for n in names) / len(names))
result["split_half"] = {"seed_chosen_on_the_other_half": round(sum(chosen) / len(chosen), 4),
                        "vote_4096": round(sum(vote) / len(vote), 4),
                        "mean_seed": round(sum(mean_seed) / len(mean_seed), 4),
                        "vote_ahead_share": round(sum(v > c for v, c in zip(vote, chosen)) / len(vote), 3)}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
