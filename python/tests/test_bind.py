"""bind(): a module built on the meta device computes exactly what load_state_dict gives."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import weightcache
from conftest import CONFIG
from tiny_model import TinyLM
from weightcache.transformers import build_and_bind, parameters_on_meta


def _ids() -> torch.Tensor:
    return torch.arange(0, 8192, 397).reshape(3, -1)


def test_bind_matches_load_state_dict_exactly(daemon, tiny_tensors):
    reference = TinyLM(CONFIG)
    reference.load_state_dict(tiny_tensors)
    want = reference(_ids())
    with parameters_on_meta():
        model = TinyLM(CONFIG)
    assert model.lm_head.weight.device.type == "meta"
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        result = weightcache.bind(model, w)
        assert result == weightcache.BindResult([], [], [])
        for name, p in model.named_parameters():
            assert p.data_ptr() == w[name].data_ptr(), name  # the mapped memory itself
            assert not p.requires_grad
            # The Weights' own tensor objects, already Parameters: no second tensor per weight.
            assert p is w[name], name
            assert isinstance(p, nn.Parameter)
    got = model(_ids())
    assert torch.equal(got, want)


def test_tied_weights_stay_tied():
    cfg = dict(CONFIG, tie_word_embeddings=True, num_hidden_layers=1, vocab_size=64)
    with parameters_on_meta():
        model = TinyLM(cfg)
    ref = TinyLM(cfg)
    sd = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    weightcache.bind(model, sd)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() == sd["model.embed_tokens.weight"].data_ptr()


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("cache", torch.arange(4.0), persistent=False)


def test_persistent_buffers_bind_and_non_persistent_ones_stay():
    sd = {"lin.weight": torch.randn(4, 4), "lin.bias": torch.randn(4), "scale": torch.randn(4)}
    m = WithBuffers()
    weightcache.bind(m, sd)
    assert m.scale is sd["scale"] and m.lin.weight.data_ptr() == sd["lin.weight"].data_ptr()
    assert torch.equal(m.cache, torch.arange(4.0))


def test_prefix_selects_a_submodule():
    sd = {"model.lin.weight": torch.randn(4, 4), "model.lin.bias": torch.randn(4),
          "model.scale": torch.randn(4), "other.x": torch.zeros(1)}
    m = WithBuffers()
    weightcache.bind(m, sd, prefix="model.")
    assert m.lin.bias.data_ptr() == sd["model.lin.bias"].data_ptr()


def test_strict_lists_every_problem_in_one_error_and_binds_nothing():
    sd = {"lin.weight": torch.randn(4, 5), "scale": torch.randn(4).double(),
          "extra.weight": torch.zeros(1), "another": torch.zeros(1)}
    m = WithBuffers()
    before = m.lin.weight
    with pytest.raises(weightcache.BindError) as e:
        weightcache.bind(m, sd)
    err = e.value
    assert err.missing == ["lin.bias"]
    assert err.unexpected == ["another", "extra.weight"]
    assert sorted(x.split(":")[0] for x in err.mismatched) == ["lin.weight", "scale"]
    for name in ("lin.bias", "another", "extra.weight", "lin.weight", "scale", "(4, 5)"):
        assert name in str(err)
    assert m.lin.weight is before


def test_non_strict_binds_what_fits_and_reports_the_rest():
    sd = {"lin.weight": torch.randn(4, 4), "scale": torch.randn(3)}
    m = WithBuffers()
    r = weightcache.bind(m, sd, strict=False)
    assert r.missing == ["lin.bias"] and len(r.mismatched) == 1 and r.unexpected == []
    assert m.lin.weight.data_ptr() == sd["lin.weight"].data_ptr()


def test_fused_views_are_not_unexpected_when_the_parts_are_used():
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self_attn = nn.Module()
            for n in ("q_proj", "k_proj", "v_proj"):
                setattr(self.self_attn, n, nn.Linear(2, 2, bias=False))

    sd = {f"self_attn.{n}.weight": torch.randn(2, 2) for n in ("q_proj", "k_proj", "v_proj")}
    sd["self_attn.qkv_proj.weight"] = torch.randn(6, 2)
    weightcache.bind(Attn(), sd)  # strict: no error


def test_build_and_bind_keeps_computed_buffers(daemon):
    class Model(TinyLM):
        def __init__(self, cfg: dict, dtype: torch.dtype) -> None:
            super().__init__(cfg, dtype)
            self.register_buffer("inv_freq", torch.arange(8.0), persistent=False)

    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        m = build_and_bind(lambda dt: Model(CONFIG, dt), w)
    assert not m.training
    assert torch.equal(m.inv_freq, torch.arange(8.0))
    assert m.lm_head.weight.dtype == torch.bfloat16
