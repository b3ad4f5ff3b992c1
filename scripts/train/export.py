#!/usr/bin/env python3
"""Writes the trained evaluation model (train.py's ckpt.pt) as GGUF, and the trainer's own logits.

  export.py OUTDIR TYPE OUT.gguf [--fixture DIR]

TYPE: f32 | f16 | q8_0. Layout: GGUF architecture `llama` with experts (Mixtral's tensor names),
vocabulary `gpt2` with pre-tokenizer `gpt-2`, BOS added. 1-D tensors and the router
(ffn_gate_inp) stay F32 in every type, as llama.cpp's converter and llama-quantize keep them.
q8_0 rounds as ggml's reference quantizer: d = amax/127 (stored f16), q = round-half-away(x/d).
--fixture DIR also writes DIR/eval-logits.f32 ([n_tok][n_vocab] float32, PyTorch forward in
float64 over the weights exactly as stored in this file) and DIR/eval-tokens.txt (the ids).
"""
import json, os, struct, sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from model import Config, MoE  # noqa: E402

GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7}  # llama_ftype
ALIGN = 32


def q8_0_roundtrip(a):
    """ggml's quantize_row_q8_0_ref on rows of 32: returns (bytes, dequantized float32 array)."""
    x = a.astype(np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (x * inv[:, None]).astype(np.float32)
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    d16 = d.astype(np.float16)
    blocks = np.zeros(x.shape[0], dtype=[("d", "<f2"), ("q", "i1", 32)])
    blocks["d"], blocks["q"] = d16, q
    deq = (q.astype(np.float32) * d16.astype(np.float32)[:, None]).reshape(a.shape)
    return blocks.tobytes(), deq


def encode(arr, kind):
    """(ggml type, bytes, values as stored) of a float32 array in the file's type."""
    if kind == "f32" or arr.ndim == 1:
        a = arr.astype(np.float32)
        return GGML_F32, a.tobytes(), a
    if kind == "f16":
        a = arr.astype(np.float16)
        return GGML_F16, a.tobytes(), a.astype(np.float32)
    b, deq = q8_0_roundtrip(arr)
    return GGML_Q8_0, b, deq


class Writer:
    def __init__(self):
        self.kv, self.tensors = [], []

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def add(self, key, kind, value):
        self.kv.append((key, kind, value))

    def _val(self, kind, v):
        if kind == "str":
            return struct.pack("<I", 8) + self._str(v)
        if kind == "u32":
            return struct.pack("<II", 4, v)
        if kind == "f32":
            return struct.pack("<If", 6, v)
        if kind == "bool":
            return struct.pack("<IB", 7, 1 if v else 0)
        if kind == "strs":
            return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(self._str(s) for s in v)
        if kind == "i32s":
            return struct.pack("<IIQ", 9, 5, len(v)) + np.asarray(v, dtype="<i4").tobytes()
        raise ValueError(kind)

    def write(self, path):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for k, kind, v in self.kv:
            head += self._str(k) + self._val(kind, v)
        off, infos = 0, b""
        for name, ne, typ, data in self.tensors:
            infos += self._str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
            infos += struct.pack("<IQ", typ, off)
            off += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        meta = head + infos
        with open(path, "wb") as f:
            f.write(meta + b"\0" * ((-len(meta)) % ALIGN))
            for _, _, _, data in self.tensors:
                f.write(data + b"\0" * ((-len(data)) % ALIGN))


def main():
    out, kind, path = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind not in FILE_TYPE:
        sys.exit(f"export.py: TYPE '{kind}': expected f32, f16 or q8_0")
    ck = torch.load(os.path.join(out, "ckpt.pt"))
    tok = json.load(open(os.path.join(out, "tok.json")))
    cfg = Config(**ck["config"])
    sd = {k: v.float().numpy() for k, v in ck["state"].items()}
    w = Writer()
    hd = cfg.dim // cfg.heads
    for k, t, v in [("general.architecture", "str", "llama"), ("general.name", "str", "mole-eval-moe"),
                    ("general.file_type", "u32", FILE_TYPE[kind]), ("general.alignment", "u32", ALIGN),
                    ("llama.context_length", "u32", cfg.ctx), ("llama.embedding_length", "u32", cfg.dim),
                    ("llama.block_count", "u32", cfg.layers), ("llama.feed_forward_length", "u32", cfg.ffn),
                    ("llama.attention.head_count", "u32", cfg.heads), ("llama.attention.head_count_kv", "u32", cfg.kv_heads),
                    ("llama.rope.dimension_count", "u32", hd), ("llama.rope.freq_base", "f32", cfg.rope_base),
                    ("llama.attention.layer_norm_rms_epsilon", "f32", cfg.eps), ("llama.expert_count", "u32", cfg.experts),
                    ("llama.expert_used_count", "u32", cfg.top_k), ("llama.vocab_size", "u32", cfg.vocab),
                    ("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", tok["pre"]),
                    ("tokenizer.ggml.tokens", "strs", tok["tokens"]),
                    ("tokenizer.ggml.token_type", "i32s", [3 if t in tok["specials"] else 1 for t in tok["tokens"]]),
                    ("tokenizer.ggml.merges", "strs", tok["merges"]),
                    ("tokenizer.ggml.bos_token_id", "u32", tok["tokens"].index("<|bos|>")),
                    ("tokenizer.ggml.eos_token_id", "u32", tok["tokens"].index("<|eos|>")),
                    ("tokenizer.ggml.add_bos_token", "bool", True), ("tokenizer.ggml.add_eos_token", "bool", False)]:
        w.add(k, t, v)
    stored = {}

    def put(name, arr, keep_f32=False):
        typ, data, vals = encode(arr, "f32" if keep_f32 else kind)
        w.tensors.append((name, list(reversed(arr.shape)), typ, data))  # GGUF lists ne0 (innermost) first
        stored[name] = vals

    put("token_embd.weight", sd["tok_emb"])  # [V, D]
    for i in range(cfg.layers):
        p, b = f"blocks.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", sd[p + "attn_norm"])  # [D]
        put(b + "attn_q.weight", sd[p + "wq"])  # [D, D]
        put(b + "attn_k.weight", sd[p + "wk"])  # [K*hd, D]
        put(b + "attn_v.weight", sd[p + "wv"])  # [K*hd, D]
        put(b + "attn_output.weight", sd[p + "wo"])  # [D, D]
        put(b + "ffn_norm.weight", sd[p + "ffn_norm"])  # [D]
        put(b + "ffn_gate_inp.weight", sd[p + "router"], keep_f32=True)  # [E, D]
        put(b + "ffn_gate_exps.weight", sd[p + "w_gate"])  # [E, F, D]
        put(b + "ffn_up_exps.weight", sd[p + "w_up"])  # [E, F, D]
        put(b + "ffn_down_exps.weight", sd[p + "w_down"])  # [E, D, F]
    put("output_norm.weight", sd["out_norm"])  # [D]
    put("output.weight", sd["out"])  # [V, D]
    w.write(path)
    print(f"{path}: {os.path.getsize(path) / 2**20:.2f} MiB, step {ck['step']}, {ck['tokens']} tokens seen", file=sys.stderr)

    if "--fixture" in sys.argv:
        fx = sys.argv[sys.argv.index("--fixture") + 1]
        os.makedirs(fx, exist_ok=True)
        names = {"token_embd.weight": "tok_emb", "output_norm.weight": "out_norm", "output.weight": "out"}
        m = MoE(cfg).double()
        rev = {}
        for i in range(cfg.layers):
            for a, b in [("attn_norm", "attn_norm"), ("attn_q", "wq"), ("attn_k", "wk"), ("attn_v", "wv"),
                         ("attn_output", "wo"), ("ffn_norm", "ffn_norm"), ("ffn_gate_inp", "router"),
                         ("ffn_gate_exps", "w_gate"), ("ffn_up_exps", "w_up"), ("ffn_down_exps", "w_down")]:
                rev[f"blk.{i}.{a}.weight"] = f"blocks.{i}.{b}"
        rev.update(names)
        m.load_state_dict({rev[n]: torch.from_numpy(v.astype(np.float64)) for n, v in stored.items()})
        enc = bpe.Encoder(tok)
        text = "The quiddity of a thing is its essence; as, the quiddity of poetry."
        ids = [tok["tokens"].index("<|bos|>")] + enc.encode(text)
        with torch.no_grad():
            logits = m(torch.tensor([ids]))[0][0]  # [n_tok, V]
        logits.float().numpy().astype("<f4").tofile(os.path.join(fx, "eval-logits.f32"))
        open(os.path.join(fx, "eval-tokens.txt"), "w").write(",".join(map(str, ids)) + "\n")
        print(f"fixture: {len(ids)} tokens -> {fx}", file=sys.stderr)


if __name__ == "__main__":
    main()
