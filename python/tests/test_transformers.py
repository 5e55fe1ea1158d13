"""weightcache.transformers: without transformers installed only the import contract is
checked here; tests/gpu/run-python-on-device.sh runs the real-model parity on the GPU
machine, where transformers is installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import weightcache.transformers as wt


def test_importing_the_module_does_not_import_transformers():
    import sys

    assert "transformers" not in sys.modules or importlib.util.find_spec("transformers")


def test_parameters_on_meta_keeps_buffers_real():
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("inv_freq", torch.arange(3.0), persistent=False)

    with wt.parameters_on_meta():
        m = M()
    assert m.lin.weight.device.type == "meta" and m.lin.bias.device.type == "meta"
    assert m.inv_freq.device.type == "cpu" and torch.equal(m.inv_freq, torch.arange(3.0))
    assert torch.nn.Module.register_parameter is not None
    m2 = M()  # the patch is gone afterwards
    assert m2.lin.weight.device.type == "cpu"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed here (it is on the GPU machine)")
def test_from_pretrained_off_mode_is_plain_from_pretrained(tmp_path):
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    m = wt.from_pretrained(str(tmp_path), mode="off")
    assert not m.training
