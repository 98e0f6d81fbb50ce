#!/usr/bin/env python3
"""Straightforward torch implementation of one DeepSeek-V4-Flash decode step (the same math as
kvcompact_cuda_dsv4_decode_bench), timed with CUDA events: per ratio-4 layer the lightning indexer
(matmul + ReLU + weighted head sum over every visible indexer row), torch.topk, a gather of the selected
compressed rows, then attention over window + selected rows with the sink (matmul, softmax with an extra
sink column, matmul) and the inverse RoPE on the output tail; ratio-128 layers attend to window + all
compressed rows, ratio-0 layers to the window. Every layer and sequence has its own tensors.

Storage: bf16 (rows and indexer rows bf16) or fp8 (attention rows: e4m3 codes with one power-of-two scale per
64-dim block and a bf16 RoPE tail; indexer rows: e4m3 codes and one f32 scale per row), dequantised by torch
where it reads them (only the gathered rows for the compressed cache).

Usage: dsv4_torch_baseline.py [--quick] [--csv FILE]
"""
import argparse
import math
import sys

import torch

# V4-Flash main layers: 0, 0, then 4 / 128 alternating over layers 2..41, then 4.
RATIOS = [0, 0] + [4, 128] * 20 + [4]
HEADS, INDEX_HEADS, TOPK, D, IDX_D, WINDOW = 64, 64, 512, 512, 128, 128


def rope_inv_freq(ratio):
    theta = 10000.0 if ratio == 0 else 160000.0
    f = [1.0 / (theta ** (2 * i / 64)) for i in range(32)]
    if ratio != 0:
        def corr(r):
            return 64 * math.log(65536 / (r * 2 * math.pi)) / (2 * math.log(theta))
        low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), 63)
        for i in range(32):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            smooth = 1 - ramp
            f[i] = f[i] / 16 * (1 - smooth) + f[i] * smooth
    return torch.tensor(f, dtype=torch.float32)


def rand_fp8(shape, dev):
    # Positive and negative finite e4m3 codes (no NaN code), as float8_e4m3fn.
    codes = torch.randint(0, 0x7E, shape, dtype=torch.uint8, device=dev)
    codes |= (torch.randint(0, 2, shape, dtype=torch.uint8, device=dev) << 7)
    return codes.view(torch.float8_e4m3fn)


class Layer:
    def __init__(self, ratio, ctx, batch, storage, dev):
        self.ratio = ratio
        vis = ctx // ratio if ratio else 0
        self.vis = vis
        self.fp8 = storage == "fp8"
        n = WINDOW + vis
        if self.fp8:
            self.codes = rand_fp8((batch, n, 448), dev)
            self.scales = torch.randint(120, 130, (batch, n, 7), dtype=torch.int32, device=dev).float().sub(127).exp2()
            self.tail = torch.randn(batch, n, 64, device=dev, dtype=torch.bfloat16)
        else:
            self.rows = torch.randn(batch, n, D, device=dev, dtype=torch.bfloat16)
        if ratio == 4:
            if self.fp8:
                self.kcodes = rand_fp8((batch, vis, IDX_D), dev)
                self.kscale = torch.full((batch, vis), 2.0 ** -4, device=dev)
            else:
                self.keys = torch.randn(batch, vis, IDX_D, device=dev, dtype=torch.bfloat16)
        inv = rope_inv_freq(ratio)
        ang = (float(ctx - 1) * inv).double()
        self.cos = ang.cos().float().to(dev)
        self.sin = ang.sin().float().to(dev)

    def dequant(self, sel):
        """Rows `sel` ([B, m] indices into the layer's rows) as bf16 [B, m, 512]."""
        if not self.fp8:
            return torch.gather(self.rows, 1, sel[..., None].expand(-1, -1, D))
        c = torch.gather(self.codes, 1, sel[..., None].expand(-1, -1, 448)).to(torch.bfloat16)
        s = torch.gather(self.scales, 1, sel[..., None].expand(-1, -1, 7)).to(torch.bfloat16)
        t = torch.gather(self.tail, 1, sel[..., None].expand(-1, -1, 64))
        c = (c.view(c.shape[0], c.shape[1], 7, 64) * s[..., None]).view(c.shape[0], c.shape[1], 448)
        return torch.cat([c, t], dim=-1)

    def window_and_all(self):
        if not self.fp8:
            return self.rows
        b, n = self.codes.shape[0], self.codes.shape[1]
        c = (self.codes.to(torch.bfloat16).view(b, n, 7, 64) * self.scales.to(torch.bfloat16)[..., None]).view(b, n, 448)
        return torch.cat([c, self.tail], dim=-1)

    def step(self, q, qi, w, sink):
        b = q.shape[0]
        if self.ratio == 4:
            if self.fp8:
                s = torch.matmul(qi, self.kcodes.to(torch.bfloat16).transpose(1, 2)).float() * self.kscale[:, None, :]
            else:
                s = torch.matmul(qi, self.keys.transpose(1, 2)).float()
            scores = (torch.relu(s) * w[:, :, None]).sum(1)  # [B, vis]
            top = torch.topk(scores, min(TOPK, self.vis), dim=-1).indices
            sel = torch.cat([torch.arange(WINDOW, device=q.device).expand(b, -1), top + WINDOW], dim=1)
            rows = self.dequant(sel)
        else:
            rows = self.window_and_all()  # ratio 128: window + all compressed rows; ratio 0: the window
        logits = torch.matmul(q, rows.transpose(1, 2)).float() * (1.0 / math.sqrt(D))  # [B, H, n]
        logits = torch.cat([logits, sink[None, :, None].expand(b, -1, 1)], dim=-1)
        p = torch.softmax(logits, dim=-1)[..., :-1].to(torch.bfloat16)
        o = torch.matmul(p, rows).float()  # [B, H, 512]
        x0, x1 = o[..., 448::2], o[..., 449::2]
        c, s_ = self.cos, -self.sin
        r0 = x0 * c - x1 * s_
        r1 = x0 * s_ + x1 * c
        o[..., 448::2] = r0
        o[..., 449::2] = r1
        return o


def bench_case(ctx, batch, storage, reps, dev):
    torch.manual_seed(0)
    layers = [Layer(r, ctx, batch, storage, dev) for r in RATIOS]
    q = torch.randn(batch, HEADS, D, device=dev, dtype=torch.bfloat16)
    qi = torch.randn(batch, INDEX_HEADS, IDX_D, device=dev, dtype=torch.bfloat16)
    w = torch.randn(batch, INDEX_HEADS, device=dev) / math.sqrt(128 * 64)
    sink = torch.randn(HEADS, device=dev)

    def step():
        for layer in layers:
            layer.step(q, qi, w, sink)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    del layers
    torch.cuda.empty_cache()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    contexts = [65536, 1048576] if args.quick else [65536, 262144, 1048576]
    reps = 3 if args.quick else 5
    out = open(args.csv, "w") if args.csv else None
    if out:
        out.write("storage,batch,context,torch_us\n")
        out.flush()
    print(f"{'storage':<8} {'batch':>5} {'context':>8} {'torch_us':>10}")
    for storage in ["bf16", "fp8"]:
        for ctx in contexts:
            for batch in [1, 8]:
                try:
                    us = bench_case(ctx, batch, storage, reps, dev)
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    us = float("nan")
                print(f"{storage:<8} {batch:>5} {ctx:>8} {us:>10.1f}", flush=True)
                if out:
                    out.write(f"{storage},{batch},{ctx},{us:.2f}\n")
                    out.flush()
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
