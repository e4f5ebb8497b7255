#!/usr/bin/env python3
"""keel_torch's recording overhead (issue 19): a PyTorch step of the GPT in bench/torch_gpt.py
(gpt-mini's size by default) unrecorded, recorded graph only (md5=False, stats=False), and with
MD5s and statistics, measured in one process with the three alternating step by step, so the
ratios share the machine's state. Prints the median step time of each and the ratios.

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_record.py \
           configs/gpt-mini.json [--steps 15] [--threads 2]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, corpus  # noqa: E402

import keel_torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    c = json.load(open(a.config))
    model = GPT(c)
    opt = torch.optim.AdamW(model.parameters(), lr=c.get("lr", 3e-3))
    data = corpus()
    b, t = c["batch_size"], c["seq_len"]
    g = torch.Generator().manual_seed(1)

    def one_step():
        ix = torch.randint(len(data) - t - 1, (b,), generator=g)
        x = torch.stack([data[i:i + t] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + t] for i in ix])
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    modes = {"unrecorded": None, "graph only": (False, False), "md5 + stats": (True, True)}
    times = {m: [] for m in modes}
    ops = {}
    with tempfile.TemporaryDirectory() as tmp:
        for step in range(a.steps + 2):
            for mode, capture in modes.items():
                if capture is None:
                    dt = one_step()
                else:
                    path = os.path.join(tmp, mode.replace(" ", "_") + ".db")
                    with keel_torch.record(path, model=model, optimizer=opt, md5=capture[0],
                                           stats=capture[1]) as session:
                        dt = one_step()
                    ops[mode] = session.seq
                if step >= 2:  # two warm-up rounds
                    times[mode].append(dt)
    base = statistics.median(times["unrecorded"])
    print(f"torch {torch.__version__} threads={a.threads} config={c.get('name', a.config)} "
          f"rounds={a.steps} ops/step={ops.get('graph only', 0)}")
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"  {mode:12s} {1000 * med:8.2f} ms/step  x{med / base:.2f}")


if __name__ == "__main__":
    main()
