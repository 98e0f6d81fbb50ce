#!/usr/bin/env python3
"""bf16 chunked-prefill attention baseline through torch SDPA, the reference for the kvcompact CUDA prefill
benchmark (bench/cuda/tq_prefill_bench.cpp, run together by scripts/gpu/steps/tq_prefill.sh).

One chunk of 2048 query tokens at positions [ctx, ctx + 2048) attends causally to a bf16 cache of
ctx + 2048 tokens (Llama-3-8B heads: 32 query / 8 KV heads, head_dim 128, batch 1). The causal mask must be
aligned bottom-right (query i sees keys [0, ctx + i]); is_causal=True in torch aligns top-left when Lq != Lk,
so the variants use torch.nn.attention.bias.causal_lower_right or an explicit boolean mask. Every variant's
first and last query rows are checked against unmasked SDPA over the keys they may see (a wrongly aligned
mask fails the check and is not counted). FLOPs: 4 · d · Hq · Σ_i (ctx + i + 1).
Writes CSV: kind,backend,context,chunk,us,tflops,ok
"""
import argparse
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # older torch
    causal_lower_right = None


def median_us(fn, warmup=2, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def check_rows(out, q, k, v, ctx, gqa):
    """First and last query rows against plain SDPA over exactly the keys they see."""
    errs = []
    for i in (0, q.shape[2] - 1):
        visible = ctx + i + 1
        kk, vv = k[:, :, :visible], v[:, :, :visible]
        if gqa > 1:
            kk = kk.repeat_interleave(gqa, dim=1)
            vv = vv.repeat_interleave(gqa, dim=1)
        ref = F.scaled_dot_product_attention(q[:, :, i:i + 1].float(), kk.float(), vv.float())
        got = out[:, :, i:i + 1].float()
        errs.append(((got - ref).abs().max() / ref.abs().max()).item())
    return max(errs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--budget-s", type=float, default=60.0, help="stop starting new cases after this long")
    args = ap.parse_args()
    t_start = time.time()
    warnings.filterwarnings("ignore")  # backends explain at length why they refuse a shape
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    hq, hkv, d = 32, 8, 128
    gqa = hq // hkv
    chunk = args.chunk
    contexts = [8192, 32768] if args.quick else [8192, 32768, 131072]
    # Rows are written as they come, so a run stopped by the step's timeout still leaves its measurements.
    out_csv = open(args.csv, "w")
    out_csv.write("kind,backend,context,chunk,us,tflops,ok\n")
    out_csv.flush()

    class Rows(list):
        def append(self, r):
            super().append(r)
            out_csv.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]:.3f},{r[5]:.2f},{r[6]}\n")
            out_csv.flush()

    rows = Rows()
    for ctx in contexts:
        if time.time() - t_start > args.budget_s:
            print(f"time budget spent: skipping ctx {ctx}", flush=True)
            continue
        length = ctx + chunk
        torch.manual_seed(ctx)
        q = torch.randn(1, hq, chunk, d, dtype=torch.bfloat16, device=dev)
        k = torch.randn(1, hkv, length, d, dtype=torch.bfloat16, device=dev)
        v = torch.randn(1, hkv, length, d, dtype=torch.bfloat16, device=dev)
        pairs = chunk * ctx + chunk * (chunk + 1) / 2
        flops = 4.0 * d * hq * pairs
        kx = vx = None
        variants = []
        if causal_lower_right is not None:
            bias = causal_lower_right(chunk, length)
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                variants.append((name + "_lower_right", backend, bias))
        # Explicit boolean mask (True = may attend): query i sees keys j <= ctx + i.
        qi = torch.arange(chunk, device=dev).unsqueeze(1)
        kj = torch.arange(length, device=dev).unsqueeze(0)
        mask = (kj <= qi + ctx)
        variants.append(("efficient_boolmask", SDPBackend.EFFICIENT_ATTENTION, mask))
        variants.append(("cudnn_boolmask", SDPBackend.CUDNN_ATTENTION, mask))
        # is_causal=True: counted only if the row check shows the backend aligns bottom-right.
        variants.append(("flash_is_causal", SDPBackend.FLASH_ATTENTION, "is_causal"))
        variants.append(("cudnn_is_causal", SDPBackend.CUDNN_ATTENTION, "is_causal"))
        # What a serving engine does with flash attention: the chunk over the cached prefix without a mask and
        # over its own keys with a square causal mask (top-left = bottom-right there), merged by log-sum-exp.
        for name in ("flash_split_lse", "cudnn_split_lse"):
            if time.time() - t_start > args.budget_s:
                break
            try:
                if kx is None:
                    kx = k.repeat_interleave(gqa, dim=1)
                    vx = v.repeat_interleave(gqa, dim=1)
                kp, vp = kx[:, :, :ctx], vx[:, :, :ctx]
                kc, vc = kx[:, :, ctx:].contiguous(), vx[:, :, ctx:].contiguous()
                kp, vp = kp.contiguous(), vp.contiguous()

                def part(kk, vv, causal, name=name):
                    if name.startswith("flash"):
                        r = torch.ops.aten._scaled_dot_product_flash_attention(q, kk, vv, 0.0, causal, False)
                    else:
                        r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, kk, vv, None, True, 0.0, causal,
                                                                                False)
                    return r[0], r[1]

                def split_call():
                    o1, l1 = part(kp, vp, False)
                    o2, l2 = part(kc, vc, True)
                    l1 = l1.reshape(1, hq, chunk, 1).float()
                    l2 = l2.reshape(1, hq, chunk, 1).float()
                    mx = torch.maximum(l1, l2)
                    w1, w2 = torch.exp(l1 - mx), torch.exp(l2 - mx)
                    return ((o1.float() * w1 + o2.float() * w2) / (w1 + w2)).to(q.dtype)

                out = split_call()
                torch.cuda.synchronize()
                err = check_rows(out, q, k, v, ctx, gqa)
                us = median_us(split_call, 2, 5 if ctx >= 131072 else 10)
                ok = err < 2e-2
                tflops = flops / (us * 1e6)
                print(f"sdpa {name:28s} ctx {ctx:7d}: {us:10.1f} us {tflops:7.1f} TFLOP/s  mask check "
                      f"{'ok' if ok else 'WRONG'} (rel err {err:.2e})", flush=True)
                rows.append(("sdpa", name, ctx, chunk, us, tflops, int(ok)))
                del kp, vp, kc, vc
            except (RuntimeError, TypeError, ValueError, AttributeError, IndexError) as e:
                msg = str(e).splitlines()[0][:90] if str(e) else type(e).__name__
                print(f"  {name} ctx={ctx}: unavailable ({msg})", flush=True)
        for name, backend, m in variants:
            if time.time() - t_start > args.budget_s:
                break
            def call(expand):
                kk, vv = (kx, vx) if expand else (k, v)
                kw = {"is_causal": True} if isinstance(m, str) else {"attn_mask": m}
                if expand:
                    return F.scaled_dot_product_attention(q, kk, vv, **kw)
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True, **kw)
            used = None
            for expand in (False, True):
                try:
                    if expand and kx is None:
                        kx = k.repeat_interleave(gqa, dim=1)
                        vx = v.repeat_interleave(gqa, dim=1)
                    with sdpa_kernel([backend]):
                        out = call(expand)
                        torch.cuda.synchronize()
                        err = check_rows(out, q, k, v, ctx, gqa)
                        us = median_us(lambda: call(expand), 2, 5 if ctx >= 131072 else 10)
                    used = (expand, err, us)
                    break
                except (RuntimeError, TypeError, ValueError) as e:
                    msg = str(e).splitlines()[0][:90] if str(e) else type(e).__name__
                    print(f"  {name} ctx={ctx} {'expanded' if expand else 'gqa'}: unavailable ({msg})", flush=True)
            if used is None:
                continue
            expand, err, us = used
            ok = err < 2e-2
            tflops = flops / (us * 1e6)
            label = name + ("_expandkv" if expand else "")
            print(f"sdpa {label:28s} ctx {ctx:7d}: {us:10.1f} us {tflops:7.1f} TFLOP/s  mask check "
                  f"{'ok' if ok else 'WRONG'} (rel err {err:.2e})", flush=True)
            rows.append(("sdpa", label, ctx, chunk, us, tflops, int(ok)))
        del q, k, v, kx, vx, mask
        torch.cuda.empty_cache()
    out_csv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
