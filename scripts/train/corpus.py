#!/usr/bin/env python3
"""Builds the evaluation model's corpus from text that Debian packages ship.

Sources (installed by `make eval-model` through scripts/train/deps.sh):
  fortunes, fortunes-min  /usr/share/games/fortunes/*      BSD (fortune-mod); quotations and short prose
  wordnet-base            /usr/share/wordnet/data.*        WordNet 3.0 licence; glosses and example sentences
  dict-gcide              /usr/share/dictd/gcide.dict.dz   GPL-2+; Webster 1913 + GCIDE definitions

Output (deterministic: same packages, same bytes): OUT/train.txt and OUT/heldout.txt,
plain ASCII English, one document per paragraph block, documents separated by a blank
line. Every 50th document of each source goes to the held-out file.
Usage: corpus.py OUTDIR
"""
import gzip, os, re, sys, unicodedata

FORTUNES = "/usr/share/games/fortunes"
WORDNET = "/usr/share/wordnet"
GCIDE = "/usr/share/dictd/gcide.dict.dz"
SKIP_FORTUNES = {"ascii-art", "art"}  # pictures, not prose
WN_EVERY, GC_EVERY = 3, 7


def ascii_clean(s):
    s = unicodedata.normalize("NFKD", s)
    s = s.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    s = "".join(c for c in s if 32 <= ord(c) < 127 or c == "\n")
    return s


def squash(s):
    return re.sub(r"[ \t]+", " ", s).strip()


def fortunes():
    docs = []
    for name in sorted(os.listdir(FORTUNES)):
        p = os.path.join(FORTUNES, name)
        if "." in name or name in SKIP_FORTUNES or os.path.islink(p) or not os.path.isfile(p):
            continue
        text = open(p, "rb").read().decode("utf-8", "replace")
        for f in text.split("\n%\n"):
            f = ascii_clean(f.replace("\t", "    "))
            lines = [l.rstrip() for l in f.split("\n")]
            f = "\n".join(lines).strip("\n")
            if len(f) < 20 or re.search(r"[|\\/_]{6,}", f):  # drop pictures drawn in characters
                continue
            docs.append(f)
    return docs


def wordnet():
    docs = []
    for pos in ("noun", "verb", "adj", "adv"):
        for line in open(os.path.join(WORDNET, "data." + pos), encoding="latin-1"):
            if line.startswith("  "):
                continue  # licence header
            head, _, gloss = line.partition(" | ")
            f = head.split()
            nw = int(f[3], 16)
            words = [f[4 + 2 * i].replace("_", " ") for i in range(nw)]
            words = [re.sub(r"\((a|p|ip)\)$", "", w) for w in words]
            gloss = ascii_clean(gloss.strip())
            if not gloss:
                continue
            docs.append(squash(", ".join(words) + " (" + pos + "): " + gloss))
    return docs


def gcide_entries():
    raw = gzip.open(GCIDE, "rb").read().decode("utf-8", "replace")
    # the first blocks are the dictionary's own header (00-database-*), skip to the first entry
    for block in re.split(r"\n\s*\n(?=\S)", raw):
        if block.startswith("00-") or block.startswith("00database"):
            continue
        yield block


def gcide_clean(block):
    block = ascii_clean(block)
    lines = block.split("\n")
    head = lines[0]
    m = re.match(r"^([^\\]+?)\s*\\[^\\]*\\,?\s*(.*)$", head)
    if m:
        head = m.group(1).strip() + (", " + m.group(2).strip() if m.group(2).strip() else "")
    body = "\n".join([head] + lines[1:])
    body = re.sub(r"\[(1913 Webster|PJC|WordNet 1\.5|Webster 1913 Suppl\.|Century Dict\.|[A-Z]{2,4})\]", "", body)
    body = re.sub(r"\\[^\\\n]*\\", "", body)  # remaining pronunciations
    body = re.sub(r"\[[\"'`^~=.,:;-]([a-zA-Z]{1,2})\]", r"\1", body)  # accent codes: quiddit['e] -> quiddite
    body = re.sub(r"\[(ae|oe|AE|OE)\]", r"\1", body)
    body = re.sub(r"\[([a-zA-Z])(\^|mac|um|breve|dot|sdot|cr|til|ring|grave|acute|cced|ced)\]", r"\1", body)  # [i^] [imac] [aum]
    body = body.replace("{", "").replace("}", "")  # cross-reference braces
    paras = [squash(p.replace("\n", " ")) for p in re.split(r"\n\s*\n", body)]
    paras = [p for p in paras if p]
    return "\n".join(paras)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    # every WN_EVERY-th WordNet synset and every GC_EVERY-th GCIDE entry: the whole alphabet, ~11 MB in all
    wn = wordnet()[::WN_EVERY]
    g = [d for d in (gcide_clean(b) for b in gcide_entries()) if len(d) >= 30][::GC_EVERY]
    sources = [("fortunes", fortunes()), ("wordnet", wn), ("gcide", g)]
    train, held = [], []
    for name, docs in sources:
        for i, d in enumerate(docs):
            (held if i % 50 == 49 else train).append(d)
        print(f"{name}: {len(docs)} documents, {sum(len(d) + 2 for d in docs) / 1e6:.2f} MB", file=sys.stderr)
    # interleave sources deterministically so every stretch of the training text mixes them
    with open(os.path.join(out, "train.txt"), "w") as f:
        f.write("\n\n".join(train) + "\n")
    with open(os.path.join(out, "heldout.txt"), "w") as f:
        f.write("\n\n".join(held) + "\n")
    for fn in ("train.txt", "heldout.txt"):
        print(f"{fn}: {os.path.getsize(os.path.join(out, fn)) / 1e6:.2f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
