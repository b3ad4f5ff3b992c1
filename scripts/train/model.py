"""The evaluation model in PyTorch: Mixtral's layout (GGUF architecture `llama` with experts).

Shapes beside every tensor: B batch, T tokens, D n_embd, H heads, K kv heads, E experts, F expert FFN.
The forward pass is the one llama.cpp and mole compute for this GGUF layout: RMSNorm (eps 1e-5),
RoPE in the normal (interleaved pairs) mode, GQA, softmax router -> top-k -> weights renormalised
over the chosen experts, SwiGLU experts.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 4096
    dim: int = 256  # D
    layers: int = 6
    heads: int = 8  # H
    kv_heads: int = 2  # K
    experts: int = 16  # E
    top_k: int = 2
    ffn: int = 256  # F, per expert
    ctx: int = 1024
    rope_base: float = 10000.0
    eps: float = 1e-5


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(cfg, T, device=None):
    hd = cfg.dim // cfg.heads
    inv = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # [hd/2]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # [T, hd/2]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):
    # x [B, T, H, hd]: pairs (2i, 2i+1) rotate by angle pos * base^(-2i/hd) (GGUF llama's normal mode)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, hd, E, Fd = cfg.dim, cfg.dim // cfg.heads, cfg.experts, cfg.ffn
        self.cfg = cfg
        self.pad = 1  # the trainer sets 64 (see moe)
        self.attn_norm = nn.Parameter(torch.ones(D))
        self.wq = nn.Parameter(torch.empty(D, D))  # [H*hd, D]
        self.wk = nn.Parameter(torch.empty(cfg.kv_heads * hd, D))  # [K*hd, D]
        self.wv = nn.Parameter(torch.empty(cfg.kv_heads * hd, D))  # [K*hd, D]
        self.wo = nn.Parameter(torch.empty(D, D))  # [D, H*hd]
        self.ffn_norm = nn.Parameter(torch.ones(D))
        self.router = nn.Parameter(torch.empty(E, D))  # [E, D]
        self.w_gate = nn.Parameter(torch.empty(E, Fd, D))  # [E, F, D]
        self.w_up = nn.Parameter(torch.empty(E, Fd, D))  # [E, F, D]
        self.w_down = nn.Parameter(torch.empty(E, D, Fd))  # [E, D, F]

    def attention(self, x, cos, sin):
        cfg = self.cfg
        B, T, D = x.shape
        hd = D // cfg.heads
        q = (x @ self.wq.t()).view(B, T, cfg.heads, hd)  # [B, T, H, hd]
        k = (x @ self.wk.t()).view(B, T, cfg.kv_heads, hd)  # [B, T, K, hd]
        v = (x @ self.wv.t()).view(B, T, cfg.kv_heads, hd)  # [B, T, K, hd]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = cfg.heads // cfg.kv_heads
        q = q.transpose(1, 2)  # [B, H, T, hd]
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)  # [B, H, T, hd]
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)  # [B, H, T, hd]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)  # [B, H, T, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)  # [B, T, D]
        return y @ self.wo.t()

    def moe(self, x):
        cfg = self.cfg
        B, T, D = x.shape
        xs = x.reshape(-1, D)  # [N, D]
        logits = xs @ self.router.t()  # [N, E]
        probs = logits.softmax(-1)  # [N, E]
        w, sel = probs.topk(cfg.top_k, dim=-1)  # [N, k]
        w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(xs)
        for e in range(cfg.experts):
            tok, slot = (sel == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            if self.pad > 1 and tok.numel() % self.pad:
                # bucketed row counts: the bf16 matmul kernels are made per shape, and rows that
                # vary every step would make new ones each time; the padding rows weigh 0
                n_pad = self.pad - tok.numel() % self.pad
                tok = torch.cat((tok, tok.new_zeros(n_pad)))
                slot = torch.cat((slot, slot.new_full((n_pad,), -1)))
            h = xs[tok]  # [n, D]
            g = F.silu(h @ self.w_gate[e].t()) * (h @ self.w_up[e].t())  # [n, F]
            we = torch.where(slot >= 0, w[tok, slot.clamp(min=0)], torch.zeros((), dtype=w.dtype))  # [n]
            y.index_add_(0, tok, ((g @ self.w_down[e].t()) * we[:, None]).to(y.dtype))
        # load balance (Switch): E * sum_e (share of routed slots to e) * (mean router prob of e)
        share = torch.zeros(cfg.experts, device=x.device).index_add_(
            0, sel.reshape(-1), torch.ones(sel.numel(), device=x.device)) / sel.numel()
        aux = cfg.experts * (share * probs.mean(0)).sum()
        zloss = torch.logsumexp(logits, -1).pow(2).mean()
        return y.view(B, T, D), aux, zloss, sel

    def forward(self, x, cos, sin):
        x = x + self.attention(rms_norm(x, self.attn_norm, self.cfg.eps), cos, sin)
        m, aux, z, sel = self.moe(rms_norm(x, self.ffn_norm, self.cfg.eps))
        return x + m, aux, z, sel


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Parameter(torch.empty(cfg.vocab, cfg.dim))  # [V, D]
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.out_norm = nn.Parameter(torch.ones(cfg.dim))
        self.out = nn.Parameter(torch.empty(cfg.vocab, cfg.dim))  # [V, D]

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                continue
            std = 0.02
            if name.endswith("wo") or name.endswith("w_down"):
                std = 0.02 / math.sqrt(2 * self.cfg.layers)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx, want_routes=False):
        B, T = idx.shape
        cos, sin = rope_tables(self.cfg, T)
        x = self.tok_emb[idx]  # [B, T, D]
        aux = z = 0.0
        routes = []
        for b in self.blocks:
            x, a, zz, sel = b(x, cos, sin)
            aux, z = aux + a, z + zz
            if want_routes:
                routes.append(sel.view(B, T, -1))
        logits = rms_norm(x, self.out_norm, self.cfg.eps) @ self.out.t()  # [B, T, V]
        n = len(self.blocks)
        return (logits, aux / n, z / n, routes) if want_routes else (logits, aux / n, z / n)
