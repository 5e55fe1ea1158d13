"""Hugging Face transformers integration: a causal LM whose weights are mapped from the cache.

    from weightcache.transformers import from_pretrained
    model = from_pretrained("/models/qwen2-7b", model="qwen2-7b", device="cuda:0")

transformers is imported only when called (it is not a dependency of the package).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import Any, Callable, Iterator, Optional

from ._bind import bind
from ._errors import BindError, WeightcacheError
from ._weights import FALLBACK_ERRORS, Weights, acquire, resolve_mode, spec_name

log = logging.getLogger("weightcache")


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Builds modules with their parameters on the meta device (no memory, no init cost)
    while buffers stay real: non-persistent buffers such as rotary ``inv_freq`` are computed
    as usual, since no checkpoint holds them."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _tie(model: Any) -> None:
    """Ties the model's weights before binding: its own tie_weights() (transformers), and
    explicitly the output embedding to the input one when the config asks for it (some
    transformers versions tie only while loading a checkpoint)."""
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    inp = get_in() if callable(get_in) else None
    out = get_out() if callable(get_out) else None
    if inp is not None and out is not None and out.weight is not inp.weight:
        out.weight = inp.weight


def _dominant_dtype(weights: Weights) -> Any:
    """The floating dtype holding the most elements (the checkpoint's compute dtype)."""
    counts: dict = {}
    for t in weights.values():
        if t.is_floating_point() and t.element_size() >= 2:
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    if not counts:
        raise WeightcacheError(f"model '{weights.model}' has no floating-point tensors")
    return max(counts, key=counts.get)


def build_and_bind(make_model: Callable[[Any], Any], weights: Weights, dtype: Any = None,
                   ignore_unexpected: Optional[list] = None) -> Any:
    """``make_model(dtype)`` under parameters_on_meta(), then bind ``weights`` (strict, except
    for unexpected names matching the model's ``ignore_unexpected`` regexes) and move what is
    left (non-persistent buffers) to the weights' device. Returns the model in eval mode."""
    dt = dtype if dtype is not None else _dominant_dtype(weights)
    with parameters_on_meta():
        model = make_model(dt)
    _tie(model)  # tied parameters become one object, which bind() binds under all its names
    result = bind(model, weights, strict=False)
    patterns = [re.compile(p) for p in (ignore_unexpected or [])]
    unexpected = [u for u in result.unexpected if not any(p.search(u) for p in patterns)]
    if result.missing or result.mismatched or unexpected:
        parts = [f"{len(v)} {k}: " + ", ".join(v) for k, v in
                 (("missing", result.missing), ("unexpected", unexpected),
                  ("mismatched", result.mismatched)) if v]
        raise BindError(f"{type(model).__name__} from '{weights.model}': " + "; ".join(parts),
                        result.missing, unexpected, result.mismatched)
    model.to(weights.device)  # buffers only: the parameters are there already (no copy)
    model.eval()
    return model


def from_pretrained(
    model_dir_or_name: str,
    *,
    model: Optional[str] = None,
    device: Any = None,
    dtype: Any = None,
    mode: Optional[str] = None,
    socket: Optional[str] = None,
    timeout: float = 600,
    fallback: bool = True,
    trust_remote_code: bool = False,
    **from_pretrained_kwargs: Any,
) -> Any:
    """A transformers causal LM with its weights mapped from the cache, ready for ``eval()``.

    The model is built from its config (read from ``model_dir_or_name``, a directory or a Hub
    name in the local cache) with its parameters on the meta device, then bound to the
    tensors of ``weightcache.acquire(model)``: no weight is read from disk or copied.

    Args:
        model_dir_or_name: where the config is (and the checkpoint, for the fallback).
        model: the daemon's spec name; default ``$WEIGHTCACHE_MODEL``, else derived from the
            directory's name (as spawn mode names it).
        device: "cuda:N", a torch device or a GPU UUID; None takes the entry where it is.
        dtype: the expected dtype; default: the cached tensors' own.
        mode: "client" | "spawn" | "off" (default ``$WEIGHTCACHE_MODE``, else client).
        fallback: when the cache cannot serve (a miss, a mismatch, no daemon, mode off), load
            with ``AutoModelForCausalLM.from_pretrained`` instead (logged); False raises.
        from_pretrained_kwargs: passed to the fallback's from_pretrained.

    Example::

        model = from_pretrained("/models/llama-8b", model="llama-8b", device="cuda:0")
        logits = model(input_ids.cuda()).logits
    """
    import transformers

    is_dir = os.path.isdir(model_dir_or_name)

    def disk() -> Any:
        kw = dict(from_pretrained_kwargs)
        if dtype is not None:
            kw.setdefault("dtype" if _new_dtype_kw() else "torch_dtype", dtype)
        m = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir_or_name, trust_remote_code=trust_remote_code, **kw)
        if device is not None:
            m.to(device if not str(device).startswith("GPU-") else _ordinal_device(device))
        return m.eval()

    if resolve_mode(mode) == "off":
        if not fallback:
            raise WeightcacheError("weightcache is off and fallback=False", "DISABLED")
        return disk()
    name = model or os.environ.get("WEIGHTCACHE_MODEL") or (
        spec_name(model_dir_or_name) if is_dir else None)
    if not name:
        raise WeightcacheError(f"{model_dir_or_name} is not a directory: pass model= (the "
                               "daemon's spec name) or set WEIGHTCACHE_MODEL")
    try:
        weights = acquire(name, device=device, dtype=dtype, mode=mode, socket=socket,
                          timeout=timeout, model_dir=model_dir_or_name if is_dir else None)
    except FALLBACK_ERRORS as e:
        if not fallback:
            raise
        log.warning("weightcache: %s: %s; loading %s from disk", type(e).__name__, e.message,
                    model_dir_or_name)
        return disk()
    config = transformers.AutoConfig.from_pretrained(
        model_dir_or_name if (is_dir or not weights.model_dir) else weights.model_dir,
        trust_remote_code=trust_remote_code)
    cls = transformers.AutoModelForCausalLM

    def make(dt: Any) -> Any:
        key = "dtype" if _new_dtype_kw() else "torch_dtype"
        try:
            return cls.from_config(config, trust_remote_code=trust_remote_code, **{key: dt})
        except TypeError:
            other = "torch_dtype" if key == "dtype" else "dtype"
            return cls.from_config(config, trust_remote_code=trust_remote_code, **{other: dt})

    ignore = None
    arch = getattr(config, "architectures", None) or []
    klass = getattr(transformers, arch[0], None) if arch else None
    if klass is not None:
        ignore = list(getattr(klass, "_keys_to_ignore_on_load_unexpected", None) or [])
    model_ = build_and_bind(make, weights, dtype, ignore)
    model_.weightcache_weights = weights  # the lease's metadata (fingerprint, map_seconds...)
    return model_


def _new_dtype_kw() -> bool:
    """transformers >= 4.56 names the argument ``dtype`` (``torch_dtype`` is deprecated)."""
    import transformers

    try:
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (4, 56)


def _ordinal_device(uuid: str) -> Any:
    import torch

    from ._torch import cuda_ordinal

    return torch.device("cuda", cuda_ordinal(uuid))
