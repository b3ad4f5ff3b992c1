#!/usr/bin/env python3
"""Figures of the trained evaluation model on the held-out text (writes OUTDIR/eval.json, OUTDIR/loss.png).

  evaluate.py OUTDIR [-c 512] [--chunks N]

- perplexity of the model (PyTorch, fp32) and of a unigram and a bigram baseline on exactly the
  tokens llama-perplexity scores at -c N: the held-out file less one trailing newline, BOS first,
  chunks of N tokens, the second half of each chunk scored. Unigram: add-one counts of the
  training tokens; bigram: interpolated absolute discounting (d = 0.75) over the unigram.
- expert usage per layer on the held-out chunks: each expert's share of the routed slots,
  against the fair share 1/E.
- routing predictability: the router of layer l+1 applied to layer l's gate input (mole's
  predictor) against layer l+1's own choice: top-1 (same first expert) and top-2 (share of the
  predicted pair in the chosen pair), for the trained model and for the same model untrained.
- the loss curve from OUTDIR/loss.csv.
"""
import json, math, os, sys
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from model import Config, MoE, rms_norm, rope_tables  # noqa: E402


def scored_chunks(ids, n_ctx, bos):
    """llama-perplexity's chunks: (inputs with BOS first, targets, first scored index)."""
    n = len(ids) // n_ctx
    for c in range(n):
        ch = ids[c * n_ctx:(c + 1) * n_ctx]
        x = [bos] + ch[1:]
        yield x, ch, n_ctx // 2


def baselines(train_ids, chunks, V):
    uni = np.bincount(train_ids, minlength=V).astype(np.float64) + 1.0
    p_uni = uni / uni.sum()
    big = Counter(zip(train_ids[:-1], train_ids[1:]))
    ctx_n, ctx_types = Counter(), Counter()
    for (a, b), n in big.items():
        ctx_n[a] += n
        ctx_types[a] += 1
    d = 0.75
    nll_u = nll_b = 0.0
    count = 0
    for x, ch, first in chunks:
        for p in range(first, len(ch) - 1):
            a, b = ch[p], ch[p + 1]
            nll_u -= math.log(p_uni[b])
            na = ctx_n.get(a, 0)
            if na:
                pb = max(big.get((a, b), 0) - d, 0) / na + d * ctx_types[a] / na * p_uni[b]
            else:
                pb = p_uni[b]
            nll_b -= math.log(pb)
            count += 1
    return math.exp(nll_u / count), math.exp(nll_b / count), count


def gate_inputs_and_routes(model, x):
    """Per layer: the gate input (ffn_norm output) [T, D] and the chosen experts [T, k]."""
    cfg = model.cfg
    cos, sin = rope_tables(cfg, x.shape[1])
    h = model.tok_emb[x]
    outs = []
    for b in model.blocks:
        h = h + b.attention(rms_norm(h, b.attn_norm, cfg.eps), cos, sin)
        g = rms_norm(h, b.ffn_norm, cfg.eps)
        m, _, _, sel = b.moe(g)
        outs.append((g[0], sel.view(-1, cfg.top_k)))
        h = h + m
    logits = rms_norm(h, model.out_norm, cfg.eps) @ model.out.t()
    return outs, logits[0]


def predictability(model, layers):
    t1 = t2 = n = 0
    for l in range(len(layers) - 1):
        g, _ = layers[l]
        _, sel_next = layers[l + 1]
        pred = (g @ model.blocks[l + 1].router.t()).topk(model.cfg.top_k, -1).indices  # [T, k]
        t1 += (pred[:, 0] == sel_next[:, 0]).sum().item()
        t2 += sum(len(set(a) & set(b)) for a, b in zip(pred.tolist(), sel_next.tolist())) / model.cfg.top_k
        n += g.shape[0]
    return t1 / n, t2 / n


def main():
    out = sys.argv[1]
    n_ctx = int(sys.argv[sys.argv.index("-c") + 1]) if "-c" in sys.argv else 512
    torch.set_num_threads(os.cpu_count())
    tok = json.load(open(os.path.join(out, "tok.json")))
    enc = bpe.Encoder(tok)
    bos = tok["tokens"].index("<|bos|>")
    held = open(os.path.join(out, "heldout.txt"), encoding="utf-8").read()
    if held.endswith("\n"):
        held = held[:-1]
    ids = [bos] + enc.encode(held)
    train_ids = np.array(enc.encode(open(os.path.join(out, "train.txt"), encoding="utf-8").read()))
    ck = torch.load(os.path.join(out, "ckpt.pt"))
    cfg = Config(**ck["config"])
    trained = MoE(cfg)
    trained.load_state_dict(ck["state"])
    untrained = MoE(cfg)
    untrained.init_weights(1)
    chunks = list(scored_chunks(ids, n_ctx, bos))
    if "--chunks" in sys.argv:  # a quick look on the first N
        chunks = chunks[:int(sys.argv[sys.argv.index("--chunks") + 1])]
    ppl_u, ppl_b, count = baselines(train_ids, chunks, cfg.vocab)
    res = {"n_ctx": n_ctx, "heldout_tokens": len(ids), "chunks": len(chunks), "scored_tokens": count,
           "train_tokens": int(len(train_ids)), "step": ck["step"], "tokens_seen": ck["tokens"],
           "epochs": ck["tokens"] / len(train_ids), "ppl_unigram": ppl_u, "ppl_bigram": ppl_b}
    usage = np.zeros((cfg.layers, cfg.experts))
    pred = {"trained": [0.0, 0.0], "untrained": [0.0, 0.0]}
    nll = 0.0
    with torch.no_grad():
        for x, ch, first in chunks:
            xt = torch.tensor([x])
            for name, m in (("trained", trained), ("untrained", untrained)):
                layers, logits = gate_inputs_and_routes(m, xt)
                a, b = predictability(m, layers)
                pred[name][0] += a / len(chunks)
                pred[name][1] += b / len(chunks)
                if name == "trained":
                    lp = F.log_softmax(logits.double(), -1)
                    tgt = torch.tensor(ch[first + 1:])
                    nll -= lp[first:len(ch) - 1].gather(1, tgt[:, None]).sum().item()
                    for l, (_, sel) in enumerate(layers):
                        usage[l] += np.bincount(sel.reshape(-1).numpy(), minlength=cfg.experts)
    res["ppl_model_pytorch"] = math.exp(nll / count)
    share = usage / usage.sum(1, keepdims=True) * cfg.experts  # 1.0 = fair share
    res["expert_share_vs_fair"] = [[round(v, 3) for v in row] for row in share.tolist()]
    res["expert_share_min"], res["expert_share_max"] = float(share.min()), float(share.max())
    res["predict_next_layer"] = {k: {"top1": v[0], "top2": v[1]} for k, v in pred.items()}
    json.dump(res, open(os.path.join(out, "eval.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "expert_share_vs_fair"}, indent=1))
    for l, row in enumerate(share):
        print(f"layer {l}: share/fair min {row.min():.2f} max {row.max():.2f}: " + " ".join(f"{v:.2f}" for v in row))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r.split(",") for r in open(os.path.join(out, "loss.csv")).read().split("\n")[1:] if r]
    tokens = np.array([float(r[1]) for r in rows]) / len(train_ids)
    tr = np.array([float(r[2]) for r in rows])
    held_pts = [(float(r[1]) / len(train_ids), float(r[4])) for r in rows if r[4] != "nan"]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    k = 10
    ax.plot(tokens[k - 1:], np.convolve(tr, np.ones(k) / k, "valid"), label="train (mean of 10 steps)")
    ax.plot([p[0] for p in held_pts], [p[1] for p in held_pts], "o-", ms=3, label="held-out (8 windows)")
    for name, v in (("unigram", ppl_u), ("bigram", ppl_b)):
        ax.axhline(math.log(v), ls="--", lw=0.8, color="gray")
        ax.text(tokens[-1], math.log(v), f" {name}", va="bottom", ha="right", fontsize=8, color="gray")
    ax.set_xlabel("epochs (passes over the %.1fM training tokens)" % (len(train_ids) / 1e6))
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(2.0, 8.5)
    ax.set_title("mole-eval-moe: 6 layers, 16 experts top-2, n_embd 256")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"))


if __name__ == "__main__":
    main()
