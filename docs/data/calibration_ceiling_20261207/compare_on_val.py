import pickle, math, statistics, torch, collections, sys
from graphs.classes import ROLES
from gnn_policy.calibration_level import fit_level
torch.set_num_threads(2)
rows = pickle.load(open('/tmp/sat/rows.pkl','rb'))
EVAL = sys.argv[1] if len(sys.argv) > 1 else "val"
train = [r for r in rows if r["split"] in ROLES["train"]]
held = [r for r in rows if r["split"] in ROLES[EVAL]]
gpus = sorted({r["gpu"] for r in rows})
def tens(part):
    F = torch.tensor([r["features"] for r in part], dtype=torch.float64)
    x = torch.tensor([math.log(r["predicted"]/r["roof"]) for r in part], dtype=torch.float64)
    y = torch.tensor([math.log(r["measured"]/r["roof"]) for r in part], dtype=torch.float64)
    cap = torch.tensor([math.log(r["bound"]/r["roof"]) for r in part], dtype=torch.float64)
    gi = torch.tensor([gpus.index(r["gpu"]) for r in part])
    return F, x, y, cap, gi
Ft, xt, yt, capt, gt = tens(train)
mean, std = Ft.mean(0), Ft.std(0); std = torch.where(std > 0, std, torch.ones_like(std))
def design(F): return (F - mean)/std
lines, w0 = fit_level(train, 3.0)
def linear_pred(F, x, gi):
    a = torch.tensor([lines[g][0] for g in gpus], dtype=torch.float64)[gi]
    b = torch.tensor([lines[g][1] for g in gpus], dtype=torch.float64)[gi]
    return a + b*x + F @ torch.tensor(w0, dtype=torch.float64)
def soft_fit(ridge=3.0, steps=300):
    # log eff = c_g - softplus(c_g - L)/... : smooth min(L, c_g); L = a_g + b_g x + w.z
    na = len(gpus)
    a = torch.tensor([lines[g][0] for g in gpus], dtype=torch.float64).requires_grad_()
    b = torch.tensor([lines[g][1] for g in gpus], dtype=torch.float64).requires_grad_()
    w = (torch.tensor(w0, dtype=torch.float64)*std).clone().requires_grad_()
    shift0 = float((torch.tensor(w0,dtype=torch.float64)*mean).sum())
    with torch.no_grad(): a += shift0
    c = torch.full((na,), -0.1, dtype=torch.float64).requires_grad_()
    lb = torch.zeros(1, dtype=torch.float64).requires_grad_()  # log beta
    Z = design(Ft)
    opt = torch.optim.LBFGS([a, b, w, c, lb], max_iter=steps, line_search_fn="strong_wolfe")
    def pred(Z, x, gi):
        L = a[gi] + b[gi]*x + Z @ w
        beta = lb.exp()
        cc = -torch.nn.functional.softplus(-c)  # c <= 0
        return cc[gi] - torch.nn.functional.softplus(beta*(cc[gi] - L))/beta
    def closure():
        opt.zero_grad()
        loss = ((pred(Z, xt, gt) - yt)**2).sum() + ridge*(w**2).sum()
        loss.backward(); return loss
    opt.step(closure)
    return lambda F, x, gi: pred(design(F), x, gi).detach(), (-torch.nn.functional.softplus(-c)).exp().tolist(), lb.exp().item()
def report(name, f):
    for g in gpus:
        for label, part in (("train", train), (EVAL, held)):
            pr = [r for r in part if r["gpu"] == g]
            if not pr: continue
            F, x, y, cap, gi = tens(pr)
            logcal = torch.minimum(f(F, x, gi), cap).clamp(max=0)
            err = (logcal - y)
            effc = logcal.exp()
            hi = err[effc > 0.8]
            print(f"{name:8s} {g[:4]} {label:11s} n={len(pr):5d} med|err| {err.abs().median():.4f}  within20 {(err.abs()<math.log(1.2)).double().mean():.2f}  eff>0.8: n={len(hi)} signed {hi.median() if len(hi) else float('nan'):.3f}")
report("linear", linear_pred)
f, caps, beta = soft_fit()
print("caps", caps, "beta", beta)
report("soft", f)
for rd in (1.0, 10.0):
    f, caps, beta = soft_fit(rd)
    print("ridge", rd, "caps", [round(c,3) for c in caps], "beta", round(beta,2)); report(f"soft{rd:g}", f)
