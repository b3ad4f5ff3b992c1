#!/usr/bin/env python3
"""llama.cpp's ids for a vectors file: NAME.llama.out beside NAME.inp.

    python3 llama_ids.py LLAMA_TOKENIZE VOCAB.gguf tests/data/tokenizer/NAME

Runs llama-tokenize (a llama.cpp build's tools/tokenize) once per text of
NAME.inp: the text on stdin as it is (--no-escape), special tokens parsed (that
tool parses them), no BOS. Not run by the tests (they have no llama.cpp): its
output is committed, and test_tok_ref checks mole against it.
"""
import subprocess
import sys

SEP = "\n__ggml_vocab_test__\n"
tool, gguf, prefix = sys.argv[1:4]
texts = open(prefix + ".inp", encoding="utf-8", newline="").read().split(SEP)[:-1]
lines = []
for t in texts:
    r = subprocess.run([tool, "-m", gguf, "--stdin", "--no-escape", "--ids", "--log-disable", "--no-bos"],
                       input=t.encode("utf-8", "surrogatepass"), capture_output=True, check=True)
    lines.append(" ".join(r.stdout.decode().strip().strip("[]").replace(",", "").split()))
with open(prefix + ".llama.out", "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"{prefix}.llama.out: {len(lines)} texts", file=sys.stderr)
