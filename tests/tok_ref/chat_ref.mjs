// The reference prompts of tests/data/chat/harmony_cases.json: each case's
// conversation rendered with gpt-oss's own template (tests/data/chat/gpt-oss.jinja)
// by @huggingface/jinja, as transformers.js's apply_chat_template renders it
// (messages, tools, add_generation_prompt, the special tokens, and the case's
// reasoning_effort / model_identity as template arguments), with today's date
// fixed to 2025-01-02. Writes a JSON array of the prompts to OUT.
//
//   node chat_ref.mjs OUT.json
import fs from "node:fs";
import path from "node:path";

const RealDate = Date;
const FIXED = RealDate.UTC(2025, 0, 2, 12);
globalThis.Date = class extends RealDate {
  constructor(...a) { super(...(a.length ? a : [FIXED])); }
  static now() { return FIXED; }
};
const { Template } = await import("@huggingface/jinja");

const src = process.env.MOLE_SOURCE_DIR ?? path.join(path.dirname(new URL(import.meta.url).pathname), "../..");
const out = process.argv[2];
const cases = JSON.parse(fs.readFileSync(path.join(src, "tests/data/chat/harmony_cases.json"), "utf8"));
const tmpl = new Template(fs.readFileSync(path.join(src, "tests/data/chat/gpt-oss.jinja"), "utf8"));

const prompts = cases.map((c) => {
  const messages = c.messages.map((m) => {
    const o = { role: m.role };
    if ("content" in m) o.content = m.content;
    if ("reasoning" in m) o.thinking = m.reasoning;
    if (m.tool_call) o.tool_calls = [{ type: "function", function: m.tool_call }];
    return o;
  });
  const kw = { messages, add_generation_prompt: c.add_generation_prompt, tools: c.tools ?? null,
               bos_token: "<|startoftext|>", eos_token: "<|return|>", pad_token: "<|endoftext|>" };
  if (c.reasoning_effort) kw.reasoning_effort = c.reasoning_effort;
  if (c.model_identity) kw.model_identity = c.model_identity;
  return tmpl.render(kw);
});
fs.writeFileSync(out, JSON.stringify(prompts, null, 1) + "\n");
console.error(`${out}: ${prompts.length} prompts`);
