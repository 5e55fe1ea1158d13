"""A small Llama-named torch module (not a real transformer: every weight is used, in a way
that makes any wrong or swapped tensor change the output)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, h: int, kv: int, i: int) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        for n, (o, inp) in {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h),
                            "o_proj": (h, h)}.items():
            setattr(self.self_attn, n, nn.Linear(inp, o, bias=False))
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, i, bias=False)
        self.mlp.up_proj = nn.Linear(h, i, bias=False)
        self.mlp.down_proj = nn.Linear(i, h, bias=False)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        y = x * self.input_layernorm.weight
        q, k, v = a.q_proj(y), a.k_proj(y), a.v_proj(y)
        kv = (k * v).sum(-1, keepdim=True)
        x = x + a.o_proj(q * torch.tanh(kv))
        y = x * self.post_attention_layernorm.weight
        return x + self.mlp.down_proj(torch.nn.functional.silu(self.mlp.gate_proj(y)) *
                                      self.mlp.up_proj(y))


class TinyLM(nn.Module):
    def __init__(self, cfg: dict, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        kv = cfg["num_key_value_heads"] * cfg["head_dim"]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(v, h)
        self.model.layers = nn.ModuleList(Block(h, kv, i) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, v, bias=False)
        if cfg.get("tie_word_embeddings"):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.to(dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(x * self.model.norm.weight)
