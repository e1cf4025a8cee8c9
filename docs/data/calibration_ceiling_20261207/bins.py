import pickle, math, statistics, torch, collections
from graphs.classes import ROLES
from gnn_policy.calibration_level import fit_level
rows = pickle.load(open('/tmp/sat/rows.pkl','rb'))
train = [r for r in rows if r["split"] in ROLES["train"]]
held = [r for r in rows if r["split"] in ROLES["val"]]
lines, w = fit_level(train, 3.0)
def line(r):
    a, b = lines[r["gpu"]]
    return a + b*math.log(r["predicted"]/r["roof"]) + sum(x*y for x, y in zip(w, r["features"]))
def cur(r, cap=0.0):
    return min(r["bound"], r["roof"]*math.exp(min(cap, line(r))))
def med(v): return statistics.median(v)
for name, part in (("train", train), ("held", held)):
  for g in sorted({r["gpu"] for r in rows}):
    pr = [r for r in part if r["gpu"] == g]
    bins = collections.defaultdict(list)
    for r in pr:
        eff = cur(r)/r["roof"]
        b = min(int(eff*10), 9)
        bins[b].append(math.log(cur(r)/r["measured"]))
    print(name, g, len(pr), "median |err|", round(med([abs(math.log(cur(r)/r["measured"])) for r in pr]),3))
    for b in sorted(bins): print("   eff bin %.1f n=%d signed med %.3f  abs med %.3f" % (b/10, len(bins[b]), med(bins[b]), med([abs(x) for x in bins[b]])))
    effs = [r["measured"]/r["roof"] for r in pr]
    print("   max measured eff", round(max(effs),3), "p99", round(sorted(effs)[int(.99*len(effs))],3))
