#!/usr/bin/env python3
"""Reference block-FP8 quantization with PyTorch on the GPU, for fp8_quant_bench --compare.

For each case writes DIR/<name>.in (bf16, row-major), DIR/<name>.fp8 (torch's
float8_e4m3fn codes) and DIR/<name>.scale (float32 weight_scale_inv, [ceil(r/128),
ceil(c/128)]), and a line "<name> <rows> <cols>" in DIR/cases.txt.

The reference, written the plain PyTorch way (as an engine would):
  amax  = |x| max per 128x128 block (zero padding at ragged edges changes no max)
  scale = amax / 448 (an all-zero block: 1)       -- tensor / tensor: IEEE division
  q     = (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
The clamp matters: torch's plain cast gives NaN above 464 (e4m3fn has no infinity). The
inputs are finite (torch's amax would propagate NaN); ours ignores NaN/Inf, tested against
the CPU quantizer instead.

  python3 fp8_torch_parity.py DIR
"""
import os
import sys

import torch


def raw(t):
    t = t.contiguous().cpu().view(torch.uint8).flatten()
    try:
        return t.numpy().tobytes()
    except Exception:  # no numpy
        return bytes(t.tolist())


def reference(x):
    rows, cols = x.shape
    br, bc = (rows + 127) // 128, (cols + 127) // 128
    xf = x.float()
    padded = torch.zeros(br * 128, bc * 128, device=x.device, dtype=torch.float32)
    padded[:rows, :cols] = xf.abs()
    amax = padded.view(br, 128, bc, 128).amax(dim=(1, 3))
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, 448.0))
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    q = (xf / full).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale


def cases(dev):
    g = torch.Generator(device=dev).manual_seed(1234)

    def randn(r, c, std=1.0):
        return (torch.randn(r, c, device=dev, generator=g) * std).to(torch.bfloat16)

    yield "normal_4096x4096", randn(4096, 4096, 0.02)
    yield "ragged_300x520", randn(300, 520, 3.0)
    yield "ragged_1000x4104", randn(1000, 4104, 0.5)
    yield "deepseek_7168x2048", randn(7168, 2048, 0.01)
    # Per-block magnitudes over many binades: tiny blocks (subnormal bf16 inputs, subnormal
    # float scales) to huge ones (near bf16's max).
    x = randn(1024, 1024)
    mags = torch.pow(2.0, torch.randint(-140, 120, (8, 8), device=dev, generator=g).float())
    x = (x.float() * mags.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.bfloat16)
    yield "binades_1024x1024", x
    # Outliers: one huge element per block; the rest quantize to subnormal fp8 codes or 0.
    x = randn(512, 768, 0.01).float()
    x[::128, ::128] = 300.0
    x[5::128, 7::128] = -1e5
    yield "outliers_512x768", x.to(torch.bfloat16)
    # Exact ties and all-zero blocks.
    x = torch.zeros(256, 384, device=dev)
    x[:128, :128] = torch.linspace(-448, 448, 128 * 128, device=dev).view(128, 128)
    x[128:, 256:] = randn(128, 128).float()
    yield "ties_zeros_256x384", x.to(torch.bfloat16)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    dev = "cuda"
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    with open(os.path.join(out, "cases.txt"), "w") as meta:
        for name, x in cases(dev):
            q, scale = reference(x)
            assert not torch.isnan(q.float()).any(), name
            for suffix, t in ((".in", x), (".fp8", q), (".scale", scale)):
                with open(os.path.join(out, name + suffix), "wb") as f:
                    f.write(raw(t))
            meta.write(f"{name} {x.shape[0]} {x.shape[1]}\n")
            print(name, tuple(x.shape))


if __name__ == "__main__":
    main()
