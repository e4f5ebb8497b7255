#!/usr/bin/env python3
"""keel_torch's recording overhead (issue 19): a PyTorch step of the GPT in bench/torch_gpt.py
(gpt-mini's size by default) unrecorded, recorded graph only (md5=False, stats=False), and with
MD5s and statistics, measured in one process with the three alternating every three steps (the
steady state of a recording: its first step is left out), so the ratios share the machine's
state. Prints the median step time of each and the ratios, and what a
recorded step hashed and reused (Note [keel_torch content cache] in python/keel_torch/_keel.cpp).

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_record.py \
           configs/gpt-mini.json [--steps 15] [--threads 2]
"""
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import setup  # noqa: E402

import keel_torch  # noqa: E402


def main():
    a, c, model, opt, data, g = setup(15)
    b, t = c["batch_size"], c["seq_len"]

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

    # Each round runs every mode for kSteps steps, one recording per mode and round; the first
    # step of each is left out (the session's first ops, its hooks), so what is timed is the
    # steady state of a recording (a step includes waiting for the previous step's hashes).
    k_steps = 3
    modes = {"unrecorded": None, "graph only": (False, False), "md5 + stats": (True, True)}
    times = {m: [] for m in modes}
    ops = {}
    hashed = reused = (0, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.steps + 1):
            for mode, capture in modes.items():
                if capture is None:
                    dts = [one_step() for _ in range(k_steps)]
                else:
                    path = os.path.join(tmp, mode.replace(" ", "_") + ".db")
                    with keel_torch.record(path, model=model, optimizer=opt, md5=capture[0],
                                           stats=capture[1]) as session:
                        dts = [one_step() for _ in range(k_steps)]
                    ops[mode] = session.seq // k_steps
                    if capture[0]:
                        hashed = tuple(v // k_steps for v in session.hashed)
                        reused = tuple(v // k_steps for v in session.reused)
                if rnd >= 1:  # a warm-up round
                    times[mode] += dts[1:]
    base = statistics.median(times["unrecorded"])
    print(f"torch {torch.__version__} threads={a.threads} config={c.get('name', a.config)} "
          f"rounds={a.steps} ops/step={ops.get('graph only', 0)}")
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"  {mode:12s} {1000 * med:8.2f} ms/step  x{med / base:.2f}")
    # Note [keel_torch content cache]: what a recorded step hashed, and what it reused.
    print(f"  md5 + stats step: {hashed[0]} tensors hashed ({hashed[1] / 2**20:.1f} MiB), "
          f"{reused[0]} reused ({reused[1] / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
