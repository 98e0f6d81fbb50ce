#!/usr/bin/env python3
"""bf16 decode-attention baseline through torch SDPA (cuDNN and flash backends) plus the device-to-device
copy bandwidth, measured in the same run as the kvcompact CUDA benchmark (scripts/gpu/run_all.sh).

Llama-3-8B heads: 32 query heads, 8 KV heads, head_dim 128, one query token, enable_gqa=True.
Each case rotates over enough K/V copies that the cache cannot sit in L2; median of CUDA-event-timed calls.
Writes CSV: kind,backend,batch,context,us,bytes,gbps
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_us(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn(0)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    rows = []
    n = 4 << 30
    src = torch.ones(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = median_us(lambda i: dst.copy_(src), 2, 10)
    copy_gbps = 2 * n / (us * 1e3)
    print(f"copy bandwidth (read+write): {copy_gbps:.0f} GB/s", flush=True)
    rows.append(("copy", "-", 0, 0, us, 2 * n, copy_gbps))
    del src, dst
    batches = [1, 8] if args.quick else [1, 8, 32, 64]
    contexts = [4096, 32768] if args.quick else [4096, 32768, 131072]
    hq, hkv, d = 32, 8, 128
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    for b in batches:
        for ctx in contexts:
            kv_bytes = b * hkv * ctx * d * 2 * 2
            copies = max(1, min(32, (512 << 20) // kv_bytes + 1))
            ks = [torch.randn(b, hkv, ctx, d, dtype=torch.bfloat16, device=dev) for _ in range(copies)]
            vs = [torch.randn(b, hkv, ctx, d, dtype=torch.bfloat16, device=dev) for _ in range(copies)]
            q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device=dev)
            for name, backend in backends:
                try:
                    with sdpa_kernel([backend]):
                        us = median_us(lambda i: F.scaled_dot_product_attention(
                            q, ks[i % copies], vs[i % copies], enable_gqa=True))
                except RuntimeError as e:  # a backend that refuses the shape
                    print(f"{name} b={b} ctx={ctx}: unavailable ({str(e).splitlines()[0][:80]})", flush=True)
                    continue
                gbps = kv_bytes / (us * 1e3)
                print(f"sdpa {name:6s} batch {b:3d} ctx {ctx:7d}: {us:9.1f} us {gbps:7.0f} GB/s", flush=True)
                rows.append(("sdpa", name, b, ctx, us, kv_bytes, gbps))
            del ks, vs, q
            torch.cuda.empty_cache()
    with open(args.csv, "w") as f:
        f.write("kind,backend,batch,context,us,bytes,gbps\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]:.3f},{r[5]},{r[6]:.1f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
