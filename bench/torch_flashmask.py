#!/usr/bin/env python3
"""PyTorch's attention on the masks keel_bench_cuda's FlashMask benchmarks use (bench/cuda):
FlexAttention (torch.compile'd flex_attention with each mask as a block mask) and
scaled_dot_product_attention with the dense boolean mask, bfloat16, batch 1, model width 2048,
same shapes. Prints one JSON object per line: {"name": "FlashMask/fwd/d64/s8192/causal",
"flex_ms": ..., "sdpa_ms": ..., "flex_tflops": ..., "sparsity": ...}. TFLOP/s are counted on the
visible (query, key) pairs, 4 d flops each forward, 3.5x that forward + backward.
Runs configurations in order until --budget seconds have passed (FlexAttention compiles per
shape and mask), so scripts/gpu-check stays inside its time. Needs a CUDA GPU.
Usage: python3 bench/torch_flashmask.py [--budget 180] [--only fwd]"""
import argparse
import json
import sys
import time

import torch


def masks(s):
    """The mask_mod of each kind, as keel::flashmask builds it (visible iff the function is
    true): column j is seen by rows j <= i < lts[j]."""
    w = s // 8
    docs = s // 8
    q = s // 4
    a = (s - q) // 3
    glob = s // 64

    def causal(b, h, i, j):
        return j <= i

    def sliding(b, h, i, j):
        return (j <= i) & (i < j + w)

    def doc(b, h, i, j):
        # 8 documents of s // 8 (the last one takes the rest)
        dj = torch.clamp(j // docs, max=7)
        return (j <= i) & (i < torch.where(dj == 7, s, (dj + 1) * docs))

    def shared_question(b, h, i, j):
        end = torch.where(j < q, s, torch.where(j < q + a, q + a,
                                                torch.where(j < q + 2 * a, q + 2 * a, s)))
        return (j <= i) & (i < end)

    def global_sliding(b, h, i, j):
        return (j <= i) & ((j < glob) | (i < j + w))

    return {"causal": causal, "sliding_window": sliding, "causal_document": doc,
            "shared_question": shared_question, "global_sliding_window": global_sliding}


def device_ms(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    best = 1e30
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / reps)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=180.0)
    ap.add_argument("--only", choices=["fwd", "fwd_bwd"], default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 0
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    start = time.time()
    for bwd in ([False, True] if args.only is None else [args.only == "fwd_bwd"]):
        for d in (64, 128):
            for s in (8192, 32768):
                for kind, mod in masks(s).items():
                    name = f"FlashMask/{'fwd_bwd' if bwd else 'fwd'}/d{d}/s{s}/{kind}"
                    if time.time() - start > args.budget:
                        print(json.dumps({"name": name, "skipped": "time budget"}))
                        continue
                    h = 2048 // d
                    g = torch.Generator(device="cuda").manual_seed(1)
                    qkv = [torch.rand(1, h, s, d, device="cuda", dtype=torch.bfloat16,
                                      generator=g) * 2 - 1 for _ in range(3)]
                    for t in qkv:
                        t.requires_grad_(bwd)
                    row = {"name": name}
                    try:
                        bm = create_block_mask(mod, None, None, s, s, device="cuda")
                        dense = None
                        visible = None
                        i = torch.arange(s, device="cuda")[:, None]
                        j = torch.arange(s, device="cuda")[None, :]
                        dense = mod(0, 0, i, j)
                        visible = int(dense.sum().item())
                        row["sparsity"] = 1.0 - visible / (s * s)
                        flops = 4.0 * d * h * visible * (3.5 if bwd else 1.0)
                        dout = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16)

                        def run_flex():
                            o = flex(*qkv, block_mask=bm)
                            if bwd:
                                o.backward(dout)

                        row["flex_ms"] = device_ms(run_flex)
                        row["flex_tflops"] = flops / (row["flex_ms"] / 1e3) / 1e12
                        try:
                            def run_sdpa():
                                o = torch.nn.functional.scaled_dot_product_attention(
                                    *qkv, attn_mask=dense)
                                if bwd:
                                    o.backward(dout)
                            row["sdpa_ms"] = device_ms(run_sdpa, reps=1)
                            row["sdpa_tflops"] = flops / (row["sdpa_ms"] / 1e3) / 1e12
                        except torch.OutOfMemoryError:
                            row["sdpa_ms"] = None
                            row["sdpa_error"] = "out of memory"
                        del dense
                    except Exception as e:  # report and go on with the next configuration
                        row["error"] = f"{type(e).__name__}: {e}"[:300]
                    print(json.dumps(row), flush=True)
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
