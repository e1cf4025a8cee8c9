"""`gnn_policy.patch(model)`: the Triton template under a model's Linear layers, for inference.

    model = gnn_policy.patch(model)      # use the return value
    with torch.inference_mode():
        y = model(x)
    model = gnn_policy.unpatch(model)    # the model as it was

Every `nn.Linear` becomes a `TritonLinear` that shares its parameters and runs
`gnn_policy.matmul` at the policy's first pick for each input shape (chosen once per shape and
cached, see `gnn_policy.ops.policy_config`; a call like one before goes straight to a
prepared launch, `gnn_policy.kernels.plan`). A layer keeps its config per input signature
for its life: after switching the checkpoint or $GNN_POLICY_GPU, patch the model again.
`patch(model, checkpoint=PATH)` picks from that checkpoint's policy instead of the default one.

Where torch.fx can trace the model, the patterns `graphs.capture` folds are fused too: a
Linear whose only user is an activation the template computes (relu, exact gelu, silu) and/or
a residual add runs as one kernel. The result is then a `torch.fx.GraphModule` and the model
itself is left untouched; a model fx cannot trace (data-dependent control flow, say) has its
Linear layers swapped in place instead, with a warning that nothing was fused.

What the kernel does not cover runs torch's own ops instead, with one warning per reason and
never an error mid-model: autograd (call under `torch.no_grad()` or `torch.inference_mode()`),
autocast, dtypes other than fp16, bf16 and fp32 or mixed ones, CPU tensors without Triton's
interpreter, bf16 under the interpreter (its bf16 products are wrong), other devices, and any
argument `gnn_policy.matmul` refuses. A residual whose dtype or shape would change the add's
result (type promotion, broadcasting to a larger shape) is added by torch after the kernel.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from graphs.capture import epilogue_chain
from gnn_policy import ops
from gnn_policy.kernels.launch import dot_precision, launch
from gnn_policy.kernels.plan import LaunchPlan, make_plan
from gnn_policy.space import TileConfig

MAX_PLANS = 256  # configs a layer keeps, one per distinct call (input shape, strides, alignment)
NO_PLAN = "no plan"  # a signature whose launch has no plan (a persistent variant, the interpreter)
_ACT = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}
_WARNED: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _WARNED:
        _WARNED.add(kind)
        warnings.warn(f"gnn_policy.patch: {message}; torch runs these layers instead", stacklevel=3)


def _signature(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)


def _unsupported(x: torch.Tensor, weight: torch.Tensor, *extra: torch.Tensor | None) -> tuple[str, str] | None:
    """(kind, why) when the template cannot serve this call; None when it can. `extra`: the
    bias and residual, whose gradients the template would lose as well."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    any(t is not None and t.requires_grad for t in extra)):
        return "autograd", "the template has no backward pass (call under torch.no_grad() or torch.inference_mode())"
    if x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type):
        return "autocast", "autocast is on, and its casts belong to torch's ops"
    if x.dtype not in ops.DTYPE_NAMES or x.dtype != weight.dtype:
        return "dtype", f"inputs {x.dtype} with weights {weight.dtype} (the template runs fp16, bf16, fp32 alone)"
    if x.device.type == "cpu" and not ops.INTERPRETED:
        return "cpu", "CPU tensors run through Triton only under TRITON_INTERPRET=1"
    if ops.INTERPRETED and x.dtype == torch.bfloat16:
        return "interpreted-bf16", f"{ops.INTERPRETER_BF16}, so bf16 under TRITON_INTERPRET=1"
    if x.device.type not in ("cpu", "cuda") or x.device != weight.device:
        return "device", f"inputs on {x.device}, weights on {weight.device}"
    if x.dim() == 0 or x.numel() == 0:
        return "empty", "empty or 0-d inputs"
    return None


class TritonLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state_dict) that runs the Triton template, with an
    optional fused activation and residual add: act(x W^T + b) + residual."""

    def __init__(self, linear: nn.Linear, activation: str | None = None, residual: bool = False,
                 checkpoint: str | None = None):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.activation, self.residual = activation, residual
        self.checkpoint = checkpoint  # the policy that picks; None: $GNN_POLICY_CHECKPOINT's or the shipped one
        # kept out of _modules, so the state_dict holds the parameters once: unpatch puts it back
        object.__setattr__(self, "original", linear)
        # per call signature: the config, then (from the second call) its launch plan, or NO_PLAN
        self._plans: dict[tuple, tuple[TileConfig, LaunchPlan | str | None]] = {}

    def __getstate__(self) -> dict:
        # a plan holds Triton's compiled kernel, which neither pickles nor deep-copies: a copy
        # (torch.save, copy.deepcopy) starts without plans and builds its own
        return {**self.__dict__, "_plans": {}}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__({"_plans": {}, **state})

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}, residual={self.residual}"

    def forward(self, input: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        why = _unsupported(input, self.weight, self.bias, residual)
        if why is None:
            try:
                return self._triton(input, residual)
            except (ValueError, TypeError) as exc:  # an argument matmul refuses: torch serves it
                why = ("refused", f"gnn_policy.matmul refused a call ({exc})")
        _warn_once(*why)
        out = _ACT[self.activation](F.linear(input, self.weight, self.bias))
        return out if residual is None else out + residual

    def _triton(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        out_shape = (*x.shape[:-1], self.out_features)
        fused = residual is not None and residual.dtype == x.dtype and \
            torch.broadcast_shapes(residual.shape, out_shape) == out_shape
        r2 = residual.expand(out_shape).reshape(-1, self.out_features) if fused else None
        x2, bias = x.reshape(-1, self.in_features), self.bias
        if bias is not None and bias.stride(0) != 1:
            bias = bias.contiguous()
        # a call like one that ran before (shapes, strides, dtypes, devices, 16-byte alignment)
        # passes the same checks and gets the same config and kernel arguments: skip to a
        # prepared launch (kernels/plan.py), whose host time is what an eager model pays per layer
        key = (_signature(x2), _signature(self.weight), _signature(bias), _signature(r2), dot_precision(x2))
        wt = self.weight.t()
        known = self._plans.get(key)
        if known is None:
            y, config = ops.matmul_and_config(x2, wt, bias=bias, activation=self.activation, residual=r2,
                                              checkpoint=self.checkpoint)
            if len(self._plans) >= MAX_PLANS:  # many distinct token counts: start over rather than grow
                self._plans.clear()
            self._plans[key] = (config, None)
        elif known[1] is None:  # the second call: run it once more to build the plan
            y, plan = make_plan(x2, wt, known[0], bias=bias, activation=self.activation, residual=r2)
            self._plans[key] = (known[0], plan if plan is not None and plan.compiled is not None else NO_PLAN)
        elif known[1] is NO_PLAN:  # a persistent variant, or the interpreter
            y = launch(x2, wt, known[0], bias=bias, activation=self.activation, residual=r2)
        else:
            y = known[1].run(x2, wt, bias, r2)
        y = y.view(out_shape)
        return y + residual if residual is not None and not fused else y


def _set_module(root: nn.Module, target: str, module: nn.Module) -> None:
    parent, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def _residual_operand(add: torch.fx.Node | None, last: torch.fx.Node) -> torch.fx.Node | None:
    """The add's other operand, when the add is a plain two-operand sum of tensors."""
    if add is None or add.kwargs or len(add.args) != 2:
        return None
    other = add.args[1] if add.args[0] is last else add.args[0]
    return other if isinstance(other, torch.fx.Node) and other is not last else None


def _fuse(model: nn.Module, checkpoint: str | None) -> torch.fx.GraphModule:
    """A traced copy of `model` (sharing its parameters) with every Linear chain as one TritonLinear."""
    gm = torch.fx.symbolic_trace(model)
    modules = dict(gm.named_modules())
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and type(modules[n.target]) is nn.Linear]
    shared = {n.target for n in calls if sum(m.target == n.target for m in calls) > 1}
    for node in calls:
        activation, act, add = epilogue_chain(node, modules)
        other = _residual_operand(add, act or node)
        add = add if other is not None else None
        # a layer called at several places keeps one module: it fuses nothing
        plain = node.target in shared or node.kwargs or len(node.args) != 1 or (act is None and add is None)
        _set_module(gm, node.target, TritonLinear(modules[node.target], None if plain else activation,
                                                  not plain and add is not None, checkpoint))
        if plain:
            continue
        last = add or act
        with gm.graph.inserting_after(last):
            fused = gm.graph.call_module(node.target, (node.args[0],) + ((other,) if add is not None else ()))
        last.replace_all_uses_with(fused)
        for dead in (add, act, node):
            if dead is not None:
                gm.graph.erase_node(dead)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    object.__setattr__(gm, "_gnn_policy_original", model)
    return gm


def patch(model: nn.Module, fuse: bool = True, checkpoint: str | Path | None = None) -> nn.Module:
    """The model with the Triton template under its Linear layers (see the module docstring).

    `fuse=False` swaps the Linear layers in place without tracing (keeps the model's class and
    methods, e.g. a `generate`, at the cost of the fused epilogues). `checkpoint`: the policy
    that picks (say one `gnn-policy finetune` wrote, with its measured winners) instead of
    $GNN_POLICY_CHECKPOINT's or the shipped one; loaded here, so a path that does not hold a
    policy is an error before anything changes.
    """
    if any(isinstance(m, TritonLinear) for m in model.modules()):
        raise ValueError("gnn_policy.patch: this model is already patched; unpatch it first")
    if checkpoint is not None:
        checkpoint = str(Path(checkpoint).resolve())
        ops._policy(checkpoint)
    if type(model) is nn.Linear:  # fx would trace its forward into F.linear, leaving nothing to swap
        return TritonLinear(model, checkpoint=checkpoint)
    if fuse:
        try:
            return _fuse(model, checkpoint)
        except Exception as exc:  # noqa: BLE001 - fx fails in many ways; every one means "cannot trace"
            warnings.warn(f"gnn_policy.patch: torch.fx cannot trace {type(model).__name__} ({type(exc).__name__}: "
                          f"{exc}); its Linear layers are swapped in place and no epilogue is fused", stacklevel=2)
    for name, module in list(model.named_modules()):
        if name and type(module) is nn.Linear:
            _set_module(model, name, TritonLinear(module, checkpoint=checkpoint))
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """The model as it was before `patch` (use the return value)."""
    original = getattr(model, "_gnn_policy_original", None)
    if original is not None:
        return original
    if isinstance(model, TritonLinear):
        return model.original
    for name, module in list(model.named_modules()):
        if isinstance(module, TritonLinear):
            _set_module(model, name, module.original)
    return model
