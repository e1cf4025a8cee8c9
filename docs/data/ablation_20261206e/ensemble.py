import math, sys, torch, collections
import hardware_specs
from gnn_policy.database import Database
from gnn_policy.policy import Policy
from gnn_policy.space import TileConfig
from gnn_policy.measure.result import CUBLAS
from graphs.classes import split_of
torch.set_num_threads(1)
cks = sys.argv[1].split(",")
pols = [Policy.load(c) for c in cks]
space = pols[0].model.space
res = collections.defaultdict(list)
with Database('/tmp/ev.sqlite') as db:
    for g, splits in (("h100", ("random-val",)), ("h200", ("val",))):
        gpu = hardware_specs.load(g)
        for problem in db.problems(gpu.name):
            sp = split_of(problem)
            if sp not in splits: continue
            figs = {k: v for k, v in db.tflops(gpu.name, problem.key).items() if k != CUBLAS}
            best = max(figs.values())
            mask = space.problem_mask(gpu, problem)
            configs = [c for c in map(TileConfig.from_key, figs) if c in space and mask[space.index(c)]]
            if not configs: continue
            preds = []
            for pol in pols:
                with torch.no_grad():
                    h, _ = pol.encode(problem, gpu)
                    idx = torch.tensor([pol.model.space.index(c) for c in configs])[None]
                    preds.append(pol.cost(h, problem, gpu, idx)[0])
            for i, pr in enumerate(preds):
                res[(sp, f"m{i}")].append(figs[configs[int(pr.argmax())].key] / best)
            avg = torch.stack(preds).mean(0)
            res[(sp, "ens")].append(figs[configs[int(avg.argmax())].key] / best)
for k, v in sorted(res.items()):
    print(k, len(v), round(math.exp(sum(map(math.log, v)) / len(v)), 4))
