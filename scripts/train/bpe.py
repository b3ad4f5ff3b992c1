#!/usr/bin/env python3
"""Byte-level BPE for the evaluation model, in the form GGUF's `gpt2` tokenizer model holds.

Pre-tokenizer: GPT-2's (tokenizer.ggml.pre = "gpt-2"), which llama.cpp and mole both know.
Token strings use GPT-2's byte-to-unicode alphabet; merges are "left right" in rank order.
Encoding applies merges lowest rank first, leftmost first on ties, as llama.cpp does.

  bpe.py train CORPUS.txt VOCAB_SIZE OUT.json      learn merges (deterministic)
  bpe.py encode OUT.json TEXT.txt                  print ids, one line per input line
"""
import heapq, json, sys
from collections import Counter

import regex

GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|bos|>", "<|eos|>"]


def byte_alphabet():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


B2U = byte_alphabet()


def pretokens(text):
    return GPT2_SPLIT.findall(text)


def train(corpus, vocab_size):
    text = open(corpus, encoding="utf-8").read()
    words = Counter(pretokens(text))
    n_merges = vocab_size - 256 - len(SPECIALS)
    syms = [[B2U[b] for b in w.encode("utf-8")] for w in words]
    freq = list(words.values())
    pair_n, where = Counter(), {}
    for i, s in enumerate(syms):
        for a, b in zip(s, s[1:]):
            pair_n[(a, b)] += freq[i]
            where.setdefault((a, b), set()).add(i)
    heap = [(-n, p) for p, n in pair_n.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        n, p = heapq.heappop(heap)
        if -n != pair_n.get(p, 0) or n == 0:
            continue  # stale entry
        merges.append(p)
        a, b = p
        ab = a + b
        touched = Counter()
        for i in where.pop(p, ()):
            s, f = syms[i], freq[i]
            for x, y in zip(s, s[1:]):
                pair_n[(x, y)] -= f
                touched[(x, y)] += 0
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(ab)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            syms[i] = out
            for x, y in zip(out, out[1:]):
                pair_n[(x, y)] += f
                where.setdefault((x, y), set()).add(i)
                touched[(x, y)] += 0
        for q in touched:
            c = pair_n[q]
            if c > 0 and q != p:
                heapq.heappush(heap, (-c, q))
            elif c <= 0:
                pair_n.pop(q, None)
        pair_n.pop(p, None)
    tokens = [B2U[b] for b in range(256)] + [a + b for a, b in merges] + SPECIALS
    return {"tokens": tokens, "merges": [a + " " + b for a, b in merges], "specials": SPECIALS,
            "pre": "gpt-2", "n_words": len(words)}


class Encoder:
    def __init__(self, tok):
        self.id = {t: i for i, t in enumerate(tok["tokens"])}
        self.rank = {tuple(m.split(" ")): r for r, m in enumerate(tok["merges"])}
        self.cache = {}

    def word(self, w):
        hit = self.cache.get(w)
        if hit is not None:
            return hit
        s = [B2U[b] for b in w.encode("utf-8")]
        while len(s) > 1:
            best, at = None, -1
            for j in range(len(s) - 1):
                r = self.rank.get((s[j], s[j + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, j
            if best is None:
                break
            s = s[:at] + [s[at] + s[at + 1]] + s[at + 2:]
        ids = [self.id[t] for t in s]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in pretokens(text):
            out.extend(self.word(w))
        return out

    def decode(self, ids, tokens):
        u2b = {u: b for b, u in B2U.items()}
        return bytes(u2b[c] for i in ids for c in tokens[i] if i < len(tokens) - len(SPECIALS)).decode("utf-8", "replace")


def main():
    if sys.argv[1] == "train":
        tok = train(sys.argv[2], int(sys.argv[3]))
        json.dump(tok, open(sys.argv[4], "w"), ensure_ascii=True)
        print(f"{len(tok['tokens'])} tokens, {len(tok['merges'])} merges from {tok['n_words']} distinct words", file=sys.stderr)
    elif sys.argv[1] == "encode":
        enc = Encoder(json.load(open(sys.argv[2])))
        for line in open(sys.argv[3], encoding="utf-8"):
            print(" ".join(map(str, enc.encode(line.rstrip("\n")))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
