import torch, statistics, math, random
from graphs.classes import ROLES
data=torch.load('/tmp/offset_family.pt')
def rows(ds, feats=True):
    out=[]
    for d in ds:
        lr=d['f'][-3]  # log of the bound with the launch floor: the base of the line here
        for p,m in d['rows']: out.append((p-lr, m-lr, d['f']+d['h'], lr, d['bound'], m))
    return out
def err(rs, a, s, w=None, mu=None, sd=None):
    e=[]
    for x,y,f,lr,b,m in rs:
        lev=0.0
        if w is not None: lev=float(((torch.tensor(f,dtype=torch.float64)-mu)/sd)@w)
        e.append(abs(min(b, lr+min(0,a+s*x+lev))-m))
    return round(statistics.median(e),3)
h200=[d for d in data if d['gpu']=='h200' and d['split'] in ROLES['train']]
R=rows(h200); F=torch.tensor([r[2] for r in R],dtype=torch.float64); mu=F.mean(0); sd=F.std(0); sd[sd==0]=1
X=torch.cat([torch.ones(len(R),1,dtype=torch.float64), torch.tensor([[r[0]] for r in R],dtype=torch.float64), (F-mu)/sd],1)
Y=torch.tensor([r[1] for r in R],dtype=torch.float64)
pen=torch.full((X.shape[1],),30.0,dtype=torch.float64); pen[:2]=0
coef=torch.linalg.solve(X.T@X+torch.diag(pen), X.T@Y); w=coef[2:]
val=rows([d for d in data if d['gpu']=='h100' and d['split']=='random-val'])
train100=[d for d in data if d['gpu']=='h100' and d['split']=='random-train']
print('cap only', err(val,0.0,1.0))
for n in (4,8,16):
  res_line=[];res_lev=[]
  for seed in range(5):
    rng=random.Random(seed); tp=rng.sample(train100,n); rs=rows(tp)
    x=torch.tensor([r[0] for r in rs],dtype=torch.float64); y=torch.tensor([r[1] for r in rs],dtype=torch.float64)
    A=torch.stack([torch.ones_like(x),x],1); a,s=torch.linalg.lstsq(A,y[:,None]).solution[:,0].tolist()
    res_line.append(err(val,a,s))
    lev=torch.tensor([float(((torch.tensor(r[2],dtype=torch.float64)-mu)/sd)@w) for r in rs],dtype=torch.float64)
    a2,s2=torch.linalg.lstsq(A,(y-lev)[:,None]).solution[:,0].tolist()
    res_lev.append(err(val,a2,s2,w,mu,sd))
  print(n,'problems x8 rows: line', statistics.mean(res_line), 'line+H200 level', statistics.mean(res_lev))
