"""bind(): put mapped tensors into a torch module in place of its parameters and buffers."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Tuple

from ._errors import BindError
from ._weights import Weights

# Fused views that engine layouts (spec layout sglang | vllm) add beside their parts.
# (docs/sharding.md, "Engine layouts"): fused name -> its members.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
         "fused_qkv_a_proj_with_mqa": ("q_a_proj", "kv_a_proj_with_mqa"),
         "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")}


class BindResult(NamedTuple):
    """What bind() did not bind (empty lists after a strict bind)."""

    missing: List[str]
    unexpected: List[str]
    mismatched: List[str]


def _slots(module: Any) -> Tuple[Dict[int, Tuple[List[str], Any, bool]], Dict[str, Any]]:
    """Every parameter and persistent buffer, grouped by identity (tied weights share one
    group): id -> (full names, tensor, is_parameter); and each name's owning module. One walk
    over ``_modules`` (named_modules() costs several times more on large models)."""
    groups: Dict[int, Tuple[List[str], Any, bool]] = {}
    owners: Dict[str, Any] = {}
    stack = [("", module)]
    while stack:  # a submodule reachable by two paths is listed under both, as by torch
        prefix, mod = stack.pop()
        for n, p in mod._parameters.items():
            if p is not None:
                owners[prefix + n] = mod
                groups.setdefault(id(p), ([], p, True))[0].append(prefix + n)
        non_persistent = mod._non_persistent_buffers_set
        for n, b in mod._buffers.items():
            if b is not None and n not in non_persistent:
                owners[prefix + n] = mod
                groups.setdefault(id(b), ([], b, False))[0].append(prefix + n)
        for n, child in mod._modules.items():
            if child is not None:
                stack.append((f"{prefix}{n}.", child))
    return groups, owners


def _covered_by_fusion(name: str, used: set) -> bool:
    """True when `name` is a fused view whose parts the module uses, or a part whose fused
    view it uses: a layout that fuses carries both forms, a module needs one."""
    head, _, leaf_param = name.rpartition(".")
    mod, _, leaf = head.rpartition(".")
    if leaf in FUSED:
        return all(f"{mod}.{part}.{leaf_param}" in used for part in FUSED[leaf])
    for fused, parts in FUSED.items():
        if leaf in parts and f"{mod}.{fused}.{leaf_param}" in used:
            return True
    return False


def bind(module: Any, weights: Mapping[str, Any], *, prefix: str = "",
         strict: bool = True) -> BindResult:
    """Replaces the parameters and persistent buffers of ``module`` with the tensors of
    ``weights`` whose names are ``prefix`` + the module's names, without copying.

    Build the module on the meta device (or anywhere: what it holds is dropped), then bind.
    Tied parameters (one tensor under several names, e.g. ``lm_head.weight`` and
    ``model.embed_tokens.weight``) stay tied: whichever of their names the weights hold is
    bound to all of them. Parameters become ``requires_grad=False`` parameters over the
    read-only memory. Non-persistent buffers (e.g. rotary ``inv_freq``) are not weights and
    are left as they are.

    With ``strict`` (default) nothing is bound unless everything fits: one :class:`BindError`
    lists every missing name, every unexpected one (weights under ``prefix`` that the module
    has no place for; fused views such as ``qkv_proj`` are not unexpected when the module
    uses their parts, nor their parts when it uses the fused view), and every shape or dtype
    mismatch. Without it, what fits is bound and the rest is returned.

    Example::

        with torch.device("meta"):
            model = MyModel(config)
        weightcache.bind(model, weightcache.acquire("my-model"))
    """
    import torch

    groups, owners = _slots(module)
    plan = []
    missing: List[str] = []
    mismatched: List[str] = []
    used = set()
    table = weights._table() if isinstance(weights, Weights) else weights  # skip a layer
    for names, current, is_param in groups.values():
        t = None
        for n in names:
            t = table.get(prefix + n) if prefix else table.get(n)
            if t is not None:
                found = n
                break
        if t is None:
            missing.extend(prefix + n for n in names)
            continue
        if prefix or len(names) > 1:
            used.update(prefix + n for n in names)
        else:
            used.add(names[0])
        if t.shape != current.shape or t.dtype != current.dtype:
            mismatched.append(
                f"{prefix + found}: module {tuple(current.shape)} {current.dtype}, weights "
                f"{tuple(t.shape)} {t.dtype}")
            continue
        plan.append((names, t, is_param))
    unexpected = sorted(
        k for k in weights
        if k.startswith(prefix) and k not in used and not _covered_by_fusion(k, used))
    if strict and (missing or unexpected or mismatched):
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected),
                             ("mismatched", mismatched)):
            if items:
                parts.append(f"{len(items)} {label}: " + ", ".join(items))
        raise BindError(f"bind({type(module).__name__}, prefix={prefix!r}): " + "; ".join(parts),
                        missing, unexpected, mismatched)
    # Weights' tensors are Parameters already (requires_grad=False); other mappings' tensors
    # become ones as nn.Parameter(t, requires_grad=False) makes them, without its __new__.
    make_param = torch.Tensor._make_subclass
    param_cls = torch.nn.Parameter
    for names, t, is_param in plan:
        if is_param:
            value = t if type(t) is param_cls and not t.requires_grad else make_param(
                param_cls, t, False)
        else:
            value = t.detach() if type(t) is param_cls else t
        for n in names:
            leaf = n.rpartition(".")[2]
            owner = owners[n]
            if is_param:
                owner._parameters[leaf] = value
            else:
                owner._buffers[leaf] = value
    return BindResult(missing, unexpected, mismatched)
