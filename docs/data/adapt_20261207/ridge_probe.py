"""Probe (2026-12-07): a ridge correction of a policy's predictions on a held-out GPU, fitted on a few replayed problems.

    python docs/data/adapt_20261207/ridge_probe.py checkpoints/meta.pt h200 train val NTUNE PER pick|sse

NTUNE tuning problems of the first 200 with rows (shuffled per seed), PER stored configs each
(half the start's best predicted, half random); the residual log(measured) - predicted,
centred within each problem, is fitted by ridge on one-hot knob values; the ridge strength is
chosen by leave-one-problem-out cross-validation (`pick`: the held-out problem's first pick;
`sse`: its squared residual). Scored: first pick among the stored configs of the first 40
evaluation problems with rows, geomean fraction of their best. Reads /tmp/ev.sqlite.
"""
import sys, math, random, json
import numpy as np, torch
import hardware_specs
from graphs import GemmProblem
from gnn_policy.collect import select_problems
from gnn_policy.database import Database
from gnn_policy.policy import Policy
from gnn_policy.space import TileConfig
from gnn_policy.measure.result import CUBLAS
from training.guard import usable

ck, gpu, tune_split, eval_split, ntune, per = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
criterion = sys.argv[7]
pol = Policy.load(ck); spec = hardware_specs.load(gpu); db = Database("/tmp/ev.sqlite")
space = pol.model.space
KN = ["block_m","block_n","block_k","split_k","group_m","num_warps","num_stages","variant"]
vals = {k: sorted({getattr(c,k) for c in space.points}, key=str) for k in KN}
def phi(c):
    v=[]
    for k in KN:
        v += [1.0 if getattr(c,k)==x else 0.0 for x in vals[k]]
    return v
def data(p):
    figs = {k:v for k,v in db.tflops(spec.name, p.key).items() if k!=CUBLAS}
    cs = usable(pol, p, spec, figs)
    if len(cs) < 2: return None
    s = pol.scores(p, spec)
    pred = torch.stack([s.by_flat[space.flat_index(c)] for c in cs]).double().numpy()
    meas = np.log([figs[c.key] for c in cs])
    return cs, pred, meas, np.array([phi(c) for c in cs])
def probs(split, n, seed=0):
    out=[]
    for p in select_problems(split, 0, seed):
        if db.best_known(spec.name, p.key):
            d=data(p)
            if d: out.append((p,d))
        if n and len(out)>=n: break
    return out
evalp = probs(eval_split, 40)
tune_pool = probs(tune_split, 200, 0)
def score(items, w):
    fr=[]
    for p,(cs,pred,meas,F) in items:
        adj = pred + (F@w if w is not None else 0)
        fr.append(math.exp(meas[int(np.argmax(adj))]-meas.max()))
    return math.exp(np.mean(np.log(fr)))
def fit(items, lam):
    X=[];y=[]
    for p,(cs,pred,meas,F) in items:
        r = meas-pred; X.append(F-F.mean(0)); y.append(r-r.mean())
    X=np.vstack(X); y=np.concatenate(y)
    return np.linalg.solve(X.T@X+lam*np.eye(X.shape[1]), X.T@y)
def sub(items, per, rng):
    out=[]
    for p,(cs,pred,meas,F) in items:
        order=list(np.argsort(-pred)); rest=order[per//2:]; rng.shuffle(rest)
        idx=(order[:per//2]+rest)[:per]
        out.append((p,(cs,pred[idx],meas[idx],F[idx])))
    return out
LAMS=[1e9,1000,300,100,30,10,3,1]
res=[]
for seed in range(3):
    rng=random.Random(seed)
    pool=list(tune_pool); rng.shuffle(pool); tune=sub(pool[:ntune], per, rng)
    # leave-one-problem-out CV (score on the tuned problem's own measured configs)
    cv={}
    for lam in LAMS:
        f=[]
        for i in range(len(tune)):
            w=fit(tune[:i]+tune[i+1:], lam)
            if criterion == "pick":
                f.append(math.log(score([tune[i]], w)))
            else:
                p,(cs,pred,meas,F)=tune[i]; r=(meas-pred)-F@w; f.append(-np.var(r))
        cv[lam]=np.mean(f)
    best=max(LAMS, key=lambda l:(cv[l], l))
    row={"seed":seed,"B0":score(evalp,None),"chosen":best,**{f"lam{l:g}":score(evalp, fit(tune,l)) for l in LAMS},"cvchosen":score(evalp, fit(tune,best)) if best<1e9 else score(evalp,None)}
    res.append(row); print({k:(round(v,3) if isinstance(v,float) else v) for k,v in row.items()}, flush=True)
print("eval problems", len(evalp), "tune pool", len(tune_pool))
