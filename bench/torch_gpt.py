#!/usr/bin/env python3
"""PyTorch yardstick for Keel's training speed: the same GPT as Keel's (pre-norm blocks, learned
position embeddings, fused qkv without bias, dense causal attention, SwiGLU MLP, untied lm_head),
the same config file, batch and optimizer (AdamW + grad clipping), on the CPU or a CUDA GPU.

Usage: python3 bench/torch_gpt.py configs/gpt-mini.json [--steps 30] [--threads 2] [--device cuda]
Prints tokens/s over the timed steps (after 3 warm-up steps). Debian's python3-torch is enough.
"""
import argparse
import json
import math
import os
import sys
import time

import torch


# The one PyTorch GPT of the repository, with Keel's module names (tests/python/keel_gpt.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from keel_gpt import GPT  # noqa: E402


def corpus():
    # Keel's corpus: each licence file a document, 0x1C (the document separator) between them.
    root = "/usr/share/common-licenses"
    docs = []
    for n in sorted(os.listdir(root)):
        p = os.path.join(root, n)
        if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) > 0:
            docs.append(open(p, "rb").read())
    return torch.tensor(list(b"\x1c".join(docs)), dtype=torch.long)


def setup(default_steps):
    """The command line (config, --steps, --threads) and what a run needs: (args, config, model,
    AdamW optimizer, corpus, batch generator). Shared with bench/torch_record.py."""
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=default_steps)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (float32, TF32 off)")
    a = ap.parse_args()
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # as Keel's default (KEEL_CUDA_TF32 unset)
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    c = json.load(open(a.config))
    model = GPT(c).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=c.get("lr", 3e-3),
                            betas=(c.get("beta1", 0.9), c.get("beta2", 0.95)),
                            weight_decay=c.get("weight_decay", 0.1))
    return a, c, model, opt, corpus(), torch.Generator().manual_seed(1)


def main():
    a, c, model, opt, data, g = setup(30)
    b, t = c["batch_size"], c["seq_len"]
    losses, times = [], []
    for step in range(a.steps + 3):
        ix = torch.randint(len(data) - t - 1, (b,), generator=g)
        x = torch.stack([data[i:i + t] for i in ix]).to(a.device)
        y = torch.stack([data[i + 1:i + 1 + t] for i in ix]).to(a.device)
        if a.device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.get("grad_clip", 1.0))
        opt.step()
        losses.append(loss.item())  # waits for the step (Keel reads its loss the same way)
        dt = time.perf_counter() - t0
        if step >= 3:
            times.append(dt)
    tok = b * t * len(times) / sum(times)
    print(f"torch {torch.__version__} device={a.device} threads={a.threads} "
          f"config={c.get('name', a.config)} "
          f"steps={a.steps} tokens/s={tok:.0f} step_ms={1000 * sum(times) / len(times):.2f} "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
