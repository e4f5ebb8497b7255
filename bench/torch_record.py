#!/usr/bin/env python3
"""keel_torch's recording overhead (issue 19): a PyTorch step of the GPT in bench/torch_gpt.py
(gpt-mini's size by default) unrecorded, recorded graph only (md5=False, stats=False), and with
MD5s and statistics, measured in one process with the three alternating every three steps (the
steady state of a recording: its first step is left out), so the ratios share the machine's
state. Prints the median step time of each and the ratios, what a recorded step hashed and
reused (Note [keel_torch content cache] in python/keel_torch/_keel.cpp), and the cost of
recording one small op.

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
    per_op()


def per_op(n=20000, rounds=5):
    """The cost of one small op (an add of two 4x4 tensors: 3 tensors to read, nothing to
    compute): unrecorded and recorded graph only, median of `rounds` loops of n ops."""
    a, b = torch.randn(4, 4), torch.randn(4, 4)

    def loop():
        t0 = time.perf_counter()
        for _ in range(n):
            a + b
        return (time.perf_counter() - t0) / n

    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds + 1):
            plain.append(loop())
            with keel_torch.record(os.path.join(tmp, "op.db"), md5=False, stats=False):
                recorded.append(loop())
    plain, recorded = statistics.median(plain[1:]), statistics.median(recorded[1:])
    print(f"  one op (add, 4x4): unrecorded {1e6 * plain:.2f} us, graph only "
          f"{1e6 * recorded:.2f} us (+{1e6 * (recorded - plain):.2f} us)")


if __name__ == "__main__":
    main()
