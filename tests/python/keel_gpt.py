"""Keel's GPT (configs/gpt-mini.json and its kind) written in plain PyTorch, for comparing a PyTorch
run with a Keel run op by op (docs/torch.md, "Comparing PyTorch with Keel"); also the model of the
PyTorch yardsticks bench/torch_gpt.py and bench/torch_record.py.

    keel train --config C.json --steps N --seed S --save-inputs IN/
    python3 tests/python/keel_gpt.py --config C.json --inputs IN/ --steps N -o torch.db
    keel record --config C.json --steps N --seed S --md5 --stats -o keel.db
    keel diff keel.db torch.db

The model is written as a PyTorch user would write it (nn.Linear, nn.Embedding, nn.LayerNorm,
attention as matmul + masked softmax, torch.optim.AdamW), not as Keel computes it: the two runs
share the architecture, the module names (so the diff can match them module by module), the
initial weights (IN/init, a Keel checkpoint) and the batches (IN/batches.safetensors), and
differ in every decomposition. Dense models with learned positions, a causal mask and no
dropout; anything else is refused.

--perturb SCOPE:DELTA adds DELTA to the first element of module SCOPE's output (a forward hook),
the injected bug the diff must find; --dumps SCOPE stores the values of that module's op outputs
(as keel record --dumps --dump-scope SCOPE), so the diff compares them element by element.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

_ST_DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64,
              "I32": torch.int32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    """The tensors of a safetensors file by name (a reader of the format's header and bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=_ST_DTYPES[e["dtype"]]) if raw else \
            torch.empty(0, dtype=_ST_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def read_checkpoint(directory):
    """Every tensor of a Keel checkpoint saved with one file (tp 1)."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if len(files) != 1:
        raise SystemExit(f"{directory}: expected one .safetensors file, found {len(files)}")
    return read_safetensors(os.path.join(directory, files[0]))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg):
    if cfg.get("norm", "layernorm") == "layernorm":
        return nn.LayerNorm(cfg["d_model"], eps=1e-5)
    return RMSNorm(cfg["d_model"])


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg["n_head"]
        self.qkv = nn.Linear(cfg["d_model"], 3 * cfg["d_model"], bias=False)
        self.proj = nn.Linear(cfg["d_model"], cfg["d_model"], bias=False)
        t = cfg["seq_len"]  # True above the diagonal: the keys a query may not see
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        hd = c // self.n_head
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class SwiGLU(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg["d_model"], cfg["d_ff"], bias=False)
        self.w3 = nn.Linear(cfg["d_model"], cfg["d_ff"], bias=False)
        self.w2 = nn.Linear(cfg["d_ff"], cfg["d_model"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp = SwiGLU(cfg)

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.wpe = nn.Embedding(cfg["seq_len"], cfg["d_model"])
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"]))
        self.norm_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg["d_model"], cfg["vocab_size"], bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.norm_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def load_config(path):
    with open(path) as f:
        cfg = json.load(f)
    defaults = {"norm": "layernorm", "position": "learned", "attention_mask": "causal",
                "dropout": 0.0, "n_expert": 0, "optimizer": "adamw", "lr": 3e-3, "min_lr": 3e-4,
                "warmup_steps": 0, "weight_decay": 0.0, "grad_clip": 1.0, "beta1": 0.9,
                "beta2": 0.999, "dtype": "float32"}
    for k, v in defaults.items():
        cfg.setdefault(k, v)
    for key, want in (("position", "learned"), ("attention_mask", "causal"), ("n_expert", 0),
                      ("dropout", 0.0), ("optimizer", "adamw"), ("dtype", "float32")):
        if cfg[key] != want:
            raise SystemExit(f"{path}: keel_gpt.py models only {key} {want!r}, got {cfg[key]!r}")
    return cfg


def lr_at(cfg, step, total):
    """Keel's schedule (optim::LrSchedule::at): linear warmup, then cosine to min_lr."""
    warm, top, low = cfg["warmup_steps"], cfg["lr"], cfg["min_lr"]
    if warm > 0 and step < warm:
        return top * (step + 1) / warm
    decay = total - 1 - warm
    if decay <= 0:
        return top
    progress = min(1.0, (step - warm) / decay)
    return low + 0.5 * (top - low) * (1.0 + math.cos(math.pi * progress))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--inputs", required=True, help="keel train --save-inputs DIR")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("-o", "--output", required=True, help="the Keel recording to write")
    ap.add_argument("--perturb", default="", help="SCOPE:DELTA")
    ap.add_argument("--dumps", default="",
                    help="store the output values of the ops in this module scope ('' none)")
    ap.add_argument("--no-record", action="store_true", help="train without recording")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    model = GPT(cfg)
    weights = read_checkpoint(os.path.join(args.inputs, "init"))
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise SystemExit(f"{args.inputs}/init lacks {', '.join(missing[:4])}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name].to(p.dtype))
    batches = read_safetensors(os.path.join(args.inputs, "batches.safetensors"))
    idx, targets = batches["idx"], batches["targets"]
    if idx.shape[0] < args.steps:
        raise SystemExit(f"{args.inputs}: {idx.shape[0]} batches for {args.steps} steps")
    if args.perturb:
        scope, delta = args.perturb.rsplit(":", 1)
        modules = dict(model.named_modules())
        if scope not in modules:
            raise SystemExit(f"--perturb: no module {scope!r}")
        bump = None

        def hook(module, inputs, output):  # adds delta to the output's first element
            nonlocal bump
            if bump is None:
                bump = torch.zeros_like(output)
                bump.view(-1)[0] = float(delta)
            return output + bump
        modules[scope].register_forward_hook(hook)
        with torch.no_grad():  # one unrecorded pass makes the bump: the recording holds one add
            model(idx[0], targets[0])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=1e-8)

    def train():
        losses = []
        for s in range(args.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, s, args.steps)
            opt.zero_grad()
            loss = model(idx[s], targets[s])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            opt.step()
            losses.append(loss.item())
        return losses

    if args.no_record:
        losses = train()
    else:
        try:
            import keel_torch
        except ImportError as e:
            raise SystemExit(f"keel_gpt.py: {e} (PYTHONPATH=build/release/python, or "
                             "--no-record)")
        with keel_torch.record(args.output, model=model, optimizer=opt, md5=True, stats=True,
                               stacks=True, config=cfg, dumps=args.dumps or False):
            losses = train()
    print("keel_gpt: losses " + " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()
