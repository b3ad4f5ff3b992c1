#!/usr/bin/env python3
"""Tokenizer vectors of the evaluation model, in llama.cpp's test-tokenizer-0 format.

  tokvectors.py OUTDIR MODEL.gguf

Writes OUTDIR/tokenizer.inp (200 held-out lines and 10 edge cases, separated by
"\\n__ggml_vocab_test__\\n") and OUTDIR/tokenizer.out (one line of ids per text, no BOS,
special tokens not parsed): the ids llama.cpp's llama-tokenize gives when $LLAMA_CPP_DIR
has a build of it, else the trainer's BPE (bpe.py), which gave the same ids when checked.
Either way the two are compared and any difference is an error.
"""
import json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

SEP = "\n__ggml_vocab_test__\n"
EXTRA = ["", " ", "  two  spaces", "don't you'll we've I'm they'd it's", "1234567 + 89 = 1234656", "tab\there",
         "line\nbreak\n\nparagraph", "caf\u00e9 na\u00efve \u00fcber", "<|bos|> is not special here",
         "   leading and trailing   "]


def main():
    out, model = sys.argv[1], sys.argv[2]
    lines = [l for l in open(os.path.join(out, "heldout.txt"), encoding="utf-8").read().split("\n") if l.strip()]
    texts = lines[::max(1, len(lines) // 200)][:200] + EXTRA
    open(os.path.join(out, "tokenizer.inp"), "w", encoding="utf-8").write(SEP.join(texts))
    enc = bpe.Encoder(json.load(open(os.path.join(out, "tok.json"))))
    ours = [enc.encode(t) for t in texts]
    tool = os.path.join(os.environ.get("LLAMA_CPP_DIR", "/nonexistent"), "build", "bin", "llama-tokenize")
    ids, source = ours, "bpe.py"
    if os.access(tool, os.X_OK):
        ids, source = [], "llama-tokenize"
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            tmp = f.name
        for t in texts:
            open(tmp, "w", encoding="utf-8").write(t)
            r = subprocess.run([tool, "-m", model, "-f", tmp, "--ids", "--no-bos", "--no-parse-special", "--no-escape",
                                "--log-disable"], capture_output=True, text=True, check=True)
            ids.append(json.loads(r.stdout.strip().splitlines()[-1]) if t else [])
        os.unlink(tmp)
        bad = [i for i, (a, b) in enumerate(zip(ids, ours)) if a != b]
        if bad:
            sys.exit(f"tokvectors: bpe.py and llama.cpp differ on {len(bad)} texts, first: {texts[bad[0]]!r}")
    with open(os.path.join(out, "tokenizer.out"), "w") as f:
        for v in ids:
            f.write("".join(" " + str(i) for i in v) + "\n")
    print(f"tokvectors: {len(texts)} texts, ids from {source}" + (", bpe.py identical" if source != "bpe.py" else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()
