import torch, statistics, math
from graphs.classes import ROLES
import pathlib
exec((pathlib.Path(__file__).parent / 'fitoff.py').read_text().split("y=torch.tensor")[0])
torch.manual_seed(0)
y=torch.tensor([target(d) for d in train],dtype=torch.float32)
for kind in ('f','hf'):
  A=X(train,kind).float(); mu=A[:,:-1].mean(0); sd=A[:,:-1].std(0)+1e-6
  norm=lambda B:(B[:,:-1]-mu)/sd
  for hid,wd in ((32,1e-3),(64,1e-2),(64,1e-3)):
    torch.manual_seed(0)
    net=torch.nn.Sequential(torch.nn.Linear(A.shape[1]-1,hid),torch.nn.GELU(),torch.nn.Linear(hid,1))
    opt=torch.optim.AdamW(net.parameters(),lr=3e-3,weight_decay=wd)
    for ep in range(600):
        opt.zero_grad(); loss=torch.nn.functional.smooth_l1_loss(net(norm(A))[:,0],y,beta=0.1); loss.backward(); opt.step()
    out=[]
    for name,sp in (('train',ROLES['train']),('val',ROLES['val']),('test',ROLES['test'])):
        for g in ('h100','h200'):
            ds=[d for d in data if d['split'] in sp and d['gpu']==g]
            with torch.no_grad(): off=net(norm(X(ds,kind).float()))[:,0].tolist()
            m,s=err(ds,off); out.append(f"{name}/{g} {m:.3f} ({s:.0%})")
    print(kind,hid,wd,' | '.join(out))
