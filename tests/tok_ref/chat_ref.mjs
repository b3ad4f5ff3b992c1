// Reference prompts: each case file's conversations rendered with a model's
// own template by @huggingface/jinja, as transformers.js's apply_chat_template
// renders them (messages, tools, add_generation_prompt, the special tokens, and
// the case's reasoning_effort / model_identity / enable_thinking = false as
// template arguments), with today's date fixed to 2025-01-02. Writes a JSON
// array of the prompts per template into OUTDIR (the names of SETS below);
// null where the template refuses the conversation.
//
//   node chat_ref.mjs OUTDIR
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
const dir = path.join(src, "tests/data/chat");
// [template, cases, output, the message field a reasoning goes to]
const SETS = [
  ["gpt-oss.jinja", "harmony_cases.json", "harmony_expected.json", "thinking"],
  ["glm-4.6.jinja", "think_cases.json", "glm-4.6_expected.json", "reasoning_content"],
  ["glm-4.7-flash.jinja", "think_cases.json", "glm-4.7-flash_expected.json", "reasoning_content"],
  ["qwen3.jinja", "think_cases.json", "qwen3_expected.json", "reasoning_content"],
  ["qwen3.5.jinja", "think_cases.json", "qwen3.5_expected.json", "reasoning_content"],
  ["deepseek-v3.jinja", "think_cases.json", "deepseek-v3_expected.json", "reasoning_content"],
  ["gemma-4.jinja", "think_cases.json", "gemma-4_expected.json", "reasoning_content"],
  ["gemma-4.jinja", "gemma_cases.json", "gemma-4_gemma_expected.json", "reasoning_content"],
];
const out = process.argv[2];
for (const [tname, cname, oname, rfield] of SETS) {
  const cases = JSON.parse(fs.readFileSync(path.join(dir, cname), "utf8"));
  const tmpl = new Template(fs.readFileSync(path.join(dir, tname), "utf8"));
  const prompts = cases.map((c) => {
    const messages = c.messages.map((m) => {
      const o = { role: m.role };
      if ("content" in m) o.content = m.content;
      if ("reasoning" in m) o[rfield] = m.reasoning;
      if (m.tool_call) o.tool_calls = [{ type: "function", function: m.tool_call }];
      return o;
    });
    const kw = { messages, add_generation_prompt: c.add_generation_prompt, tools: c.tools ?? null,
                 bos_token: tname.startsWith("deepseek") ? "<｜begin▁of▁sentence｜>" : "<bos>" };
    if (c.reasoning_effort) kw.reasoning_effort = c.reasoning_effort;
    if (c.model_identity) kw.model_identity = c.model_identity;
    if (c.no_thinking) kw.enable_thinking = false;
    if (c.thinking) kw.enable_thinking = true;
    try {
      return tmpl.render(kw);
    } catch (e) {
      return null;  // the template refuses the conversation (raise_exception)
    }
  });
  fs.writeFileSync(path.join(out, oname), JSON.stringify(prompts, null, 1) + "\n");
  console.error(`${oname}: ${prompts.length} prompts`);
}
