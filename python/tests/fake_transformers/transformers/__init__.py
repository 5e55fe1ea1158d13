"""A test double of the few `transformers` entry points that weightcache.transformers calls
(AutoConfig.from_pretrained, AutoModelForCausalLM.from_config / from_pretrained), over the
tests' TinyLM. Used only where the real transformers is not installed (the CI machine); the
GPU machine runs weightcache.transformers against transformers 5 itself
(tests/gpu/run-python-on-device.sh)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

__version__ = "5.0.0"
calls = []  # (entry point, argument) in call order, for the tests to check


class AutoConfig:
    @staticmethod
    def from_pretrained(path, trust_remote_code=False):
        calls.append(("AutoConfig.from_pretrained", str(path)))
        d = json.loads((Path(path) / "config.json").read_text())
        return SimpleNamespace(raw=d, architectures=d["architectures"],
                               tie_word_embeddings=d.get("tie_word_embeddings", False))


class AutoModelForCausalLM:
    @staticmethod
    def from_config(config, trust_remote_code=False, dtype=None):
        from tiny_model import TinyLM

        calls.append(("from_config", dtype))
        return TinyLM(config.raw, dtype)

    @staticmethod
    def from_pretrained(path, trust_remote_code=False, dtype=None):
        from tiny_model import TinyLM
        from weightcache._verify import read_index

        calls.append(("from_pretrained", str(path)))
        config = json.loads((Path(path) / "config.json").read_text())
        model = TinyLM(config, dtype or torch.bfloat16)
        state = {}
        for name, t in read_index(str(path)).items():
            with open(t.path, "rb") as f:
                f.seek(t.begin)
                raw = bytearray(f.read(t.end - t.begin))
            state[name] = torch.frombuffer(raw, dtype=torch.bfloat16).reshape(t.shape)
        model.load_state_dict(state)
        return model


class LlamaForCausalLM:
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb\.inv_freq"]
