"""Fixtures: small seeded checkpoints written here, and real weightcached processes (host
backend) serving them from a per-test temporary socket dir."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("WEIGHTCACHE_BUILD_DIR", ROOT / "build"))
WEIGHTCACHED = BUILD / "cmd/weightcached/weightcached"
CAPI_EXAMPLE = BUILD / "pkg/client/capi/wc_capi_example"
LIB = BUILD / "pkg/client/capi/libweightcache.so"

# A small Llama: real tensor names, divisible for tp 2, ~10 MB of bf16.
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "head_dim": 64, "vocab_size": 8192, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}

_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
              torch.int64: "I64", torch.uint8: "U8"}


def write_safetensors(path: Path, tensors: Dict[str, torch.Tensor]) -> None:
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dim() else \
            t.reshape(1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def llama_tensors(cfg: dict, seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]

    def r(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": r(v, h), "model.norm.weight": r(h)}
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = r(v, h)
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out.update({
            p + "self_attn.q_proj.weight": r(h, h), p + "self_attn.k_proj.weight": r(kv, h),
            p + "self_attn.v_proj.weight": r(kv, h), p + "self_attn.o_proj.weight": r(h, h),
            p + "mlp.gate_proj.weight": r(i, h), p + "mlp.up_proj.weight": r(i, h),
            p + "mlp.down_proj.weight": r(h, i), p + "input_layernorm.weight": r(h),
            p + "post_attention_layernorm.weight": r(h),
        })
    return out


def write_checkpoint(d: Path, cfg: dict, seed: int) -> Dict[str, torch.Tensor]:
    d.mkdir(parents=True, exist_ok=True)
    tensors = llama_tensors(cfg, seed)
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", tensors)
    return tensors


def tensor_sha(t: torch.Tensor) -> str:
    c = t.detach().cpu().contiguous()
    return hashlib.sha256(c.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class Daemon:
    """A running weightcached; `socket` is its socket dir."""

    def __init__(self, root: Path, models: List[dict], extra: List[str] = ()) -> None:
        self.socket = tempfile.mkdtemp(prefix="wcs", dir="/tmp")
        self.log = root / "weightcached.log"
        spec = root / "models.json"
        spec.write_text(json.dumps({"models": [dict(version=1, **m) for m in models]}))
        # Roles are granted, never implied: this uid may publish on the engine socket; admin
        # operations go through the admin socket (<socket_dir>-admin).
        argv = [str(WEIGHTCACHED), f"--socket_dir={self.socket}/s", "--backend=host",
                "--metrics_address=off", f"--spec_file={spec}", f"--publish_uids={os.getuid()}",
                *extra]
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        self.socket += "/s"
        self.admin_socket = self.socket + "-admin"

    def restart(self) -> None:
        """Stops this daemon (SIGTERM) and starts it again on the same socket dir."""
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.proc = subprocess.Popen(self.argv, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, names: List[str], timeout: float = 30) -> None:
        import weightcache

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                st = weightcache.status(socket=self.socket)
                ready = {e["model"] for e in st.get("entries", []) if e["state"] == "ready"}
                if all(n in ready for n in names):
                    return
            except weightcache.DaemonUnavailable:
                pass
            time.sleep(0.02)  # polling a condition with a deadline
        raise AssertionError(f"daemon not ready with {names}:\n{self.log.read_text()}")

    def leases(self, model: str, pid: int = 0) -> int:
        import weightcache

        st = weightcache.status(socket=self.socket)
        return sum(1 for e in st.get("entries", []) if e["model"] == model
                   for lease in e.get("leases", []) if not pid or lease["pid"] == pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        shutil.rmtree(Path(self.socket).parent, ignore_errors=True)


def wait_until(cond, timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.01)  # polling a condition with a deadline
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Dict[str, Path]:
    base = tmp_path_factory.mktemp("ckpt")
    out = {"tiny": base / "tiny", "awq": base / "awq", "other": base / "other",
           "stale": base / "stale"}
    write_checkpoint(out["tiny"], CONFIG, seed=1)
    # Other shapes too: its header differs from tiny's (see test_load_verify_evict).
    write_checkpoint(out["other"], dict(CONFIG, vocab_size=4096), seed=3)
    write_checkpoint(out["stale"], dict(CONFIG, vocab_size=2048), seed=4)  # rewritten by a test
    write_checkpoint(out["awq"], dict(CONFIG, quantization_config={"quant_method": "awq",
                                                                    "bits": 4}), seed=2)
    return out


@pytest.fixture(scope="session")
def tiny_tensors(checkpoints) -> Dict[str, torch.Tensor]:
    return llama_tensors(CONFIG, seed=1)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory, checkpoints) -> Iterator[Daemon]:
    assert WEIGHTCACHED.exists(), f"{WEIGHTCACHED} not built"
    d = Daemon(tmp_path_factory.mktemp("daemon"),
               [{"name": "tiny", "model_dir": str(checkpoints["tiny"])},
                {"name": "tiny2", "model_dir": str(checkpoints["tiny"]), "tp_size": 2},
                {"name": "awq", "model_dir": str(checkpoints["awq"])},
                {"name": "other", "model_dir": str(checkpoints["other"]), "tp_size": 2},
                {"name": "stale", "model_dir": str(checkpoints["stale"])}],
               ["--preload=false"])
    import weightcache

    d.wait_ready([])  # answering
    weightcache.load("tiny", socket=d.socket)
    d.wait_ready(["tiny"])
    yield d
    d.stop()


def run_python(code: str, env: dict = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (this one: the venv under test)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=timeout)
