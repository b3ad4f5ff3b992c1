#!/usr/bin/env python3
"""Trains the evaluation MoE (model.py) on the corpus (corpus.py) with the BPE (bpe.py).

  train.py OUTDIR [--steps N] [--minutes M]

Reads OUTDIR/train.txt, OUTDIR/heldout.txt and OUTDIR/tok.json; writes OUTDIR/ckpt.pt (weights,
config, tokenizer) and OUTDIR/loss.csv (step, tokens, train loss, balance loss, held-out loss, lr, s).
Windows: a random stretch of the token stream with its first token replaced by BOS, as
llama-perplexity feeds its chunks. The first 3/4 of the steps use 512-token windows
(16 per step), the rest 1024-token windows (8 per step): 8192 tokens a step either way.
bf16 autocast (fp32 master weights, AdamW), load-balancing loss 0.01, router z-loss 1e-3.
"""
import json, math, os, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from model import Config, MoE  # noqa: E402


def tokens_of(path, enc):
    return torch.tensor(enc.encode(open(path, encoding="utf-8").read()), dtype=torch.long)


def windows(stream, n, T, bos, g):
    start = torch.randint(0, len(stream) - T - 1, (n,), generator=g)
    w = torch.stack([stream[s:s + T + 1] for s in start.tolist()])  # [n, T+1]
    x, y = w[:, :-1].clone(), w[:, 1:]
    x[:, 0] = bos
    return x, y


def main():
    out = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 900
    torch.manual_seed(1234)
    torch.set_num_threads(os.cpu_count())
    tok = json.load(open(os.path.join(out, "tok.json")))
    enc = bpe.Encoder(tok)
    bos = tok["tokens"].index("<|bos|>")
    train_ids, held_ids = tokens_of(os.path.join(out, "train.txt"), enc), tokens_of(os.path.join(out, "heldout.txt"), enc)
    print(f"train {len(train_ids)} tokens, held-out {len(held_ids)} tokens", file=sys.stderr)
    cfg = Config(vocab=len(tok["tokens"]))
    model = MoE(cfg)
    model.init_weights(1)
    for b in model.blocks:
        b.pad = 64
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    plain = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    peak, floor, warm = 3e-3, 3e-4, 50
    g = torch.Generator().manual_seed(42)
    gh = torch.Generator().manual_seed(7)
    hx, hy = windows(held_ids, 8, 512, bos, gh)
    log = open(os.path.join(out, "loss.csv"), "w")
    log.write("step,tokens,train_loss,balance_loss,heldout_loss,lr,seconds\n")
    t0, seen = time.time(), 0
    for step in range(1, steps + 1):
        lr = peak * step / warm if step <= warm else floor + 0.5 * (peak - floor) * (
            1 + math.cos(math.pi * (step - warm) / (steps - warm)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        T = 512 if step <= steps * 3 // 4 else 1024
        x, y = windows(train_ids, 8192 // T, T, bos, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, aux, z = model(x)
        ce = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), y.reshape(-1))
        loss = ce + 0.01 * aux + 1e-3 * z
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seen += x.numel()
        held = float("nan")
        if step % 50 == 0 or step == steps:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                hl, _, _ = model(hx)
                held = F.cross_entropy(hl.float().reshape(-1, cfg.vocab), hy.reshape(-1)).item()
            torch.save({"config": cfg.__dict__, "state": model.state_dict(), "step": step, "tokens": seen},
                       os.path.join(out, "ckpt.pt"))
        el = time.time() - t0
        log.write(f"{step},{seen},{ce.item():.4f},{aux.item():.4f},{held:.4f},{lr:.6f},{el:.1f}\n")
        log.flush()
        if step % 10 == 0 or step == 1:
            print(f"step {step}/{steps} T {T} loss {ce.item():.3f} bal {aux.item():.3f} held {held:.3f} "
                  f"{seen / el:.0f} tok/s epoch {seen / len(train_ids):.2f}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
