"""weightcache.transformers. The real transformers is not installed on the CI machine: there
these tests run the integration's own logic against tests/fake_transformers (a test double of
the three entry points it calls); tests/gpu/run-python-on-device.sh runs it against
transformers 5 with real Qwen2 and Llama models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import weightcache
import weightcache.transformers as wt

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture
def fake_transformers(monkeypatch):
    if HAVE_TRANSFORMERS and "fake_transformers" not in str(importlib.util.find_spec(
            "transformers").origin):
        pytest.skip("the real transformers is installed: the GPU script covers it")
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fake_transformers"))
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    import transformers

    transformers.calls.clear()
    return transformers


def _ids() -> torch.Tensor:
    return torch.arange(0, 8192, 397).reshape(3, -1)


def test_importing_the_module_does_not_import_transformers():
    assert "transformers" not in sys.modules or HAVE_TRANSFORMERS


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
    assert M().lin.weight.device.type == "cpu"  # the patch is gone afterwards


def test_from_pretrained_maps_and_matches_the_disk_load(daemon, checkpoints, fake_transformers):
    d = str(checkpoints["tiny"])
    disk = fake_transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    fake_transformers.calls.clear()
    model = wt.from_pretrained(d, model="tiny", socket=daemon.socket, fallback=False)
    assert [c[0] for c in fake_transformers.calls] == ["AutoConfig.from_pretrained",
                                                       "from_config"]
    assert fake_transformers.calls[1][1] == torch.bfloat16  # the cached tensors' dtype
    assert not model.training
    w = model.weightcache_weights
    assert model.lm_head.weight.data_ptr() == w["lm_head.weight"].data_ptr()
    with torch.no_grad():
        assert torch.equal(model(_ids()), disk(_ids()))


def test_from_pretrained_falls_back_to_the_disk_on_a_miss(daemon, checkpoints,
                                                          fake_transformers, caplog):
    d = str(checkpoints["tiny"])
    model = wt.from_pretrained(d, model="no-such-model", socket=daemon.socket)
    assert [c[0] for c in fake_transformers.calls] == ["from_pretrained"]
    assert "CacheMiss" in caplog.text and not model.training
    with pytest.raises(weightcache.CacheMiss):
        wt.from_pretrained(d, model="no-such-model", socket=daemon.socket, fallback=False)


def test_from_pretrained_off_mode_reads_the_disk(checkpoints, fake_transformers):
    model = wt.from_pretrained(str(checkpoints["tiny"]), mode="off")
    assert [c[0] for c in fake_transformers.calls] == ["from_pretrained"]
    assert model.lm_head.weight.device.type == "cpu"


def test_a_name_that_is_no_directory_needs_a_model(fake_transformers, monkeypatch):
    monkeypatch.delenv("WEIGHTCACHE_MODEL", raising=False)
    with pytest.raises(weightcache.WeightcacheError, match="model="):
        wt.from_pretrained("org/not-a-dir", mode="client")


def test_tied_embeddings_are_tied_before_binding():
    class Tied(torch.nn.Module):
        """A model whose config asks for tied embeddings but whose construction does not
        tie them (as some transformers versions leave it until a checkpoint is loaded)."""

        def __init__(self) -> None:
            super().__init__()
            from types import SimpleNamespace

            self.config = SimpleNamespace(tie_word_embeddings=True)
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8, bias=False)

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    with wt.parameters_on_meta():
        m = Tied()
    assert m.head.weight is not m.embed.weight
    wt._tie(m)
    sd = {"embed.weight": torch.randn(8, 4)}
    weightcache.bind(m, sd)
    assert m.head.weight is m.embed.weight
    assert m.head.weight.data_ptr() == sd["embed.weight"].data_ptr()
