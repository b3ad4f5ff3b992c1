// The official openai npm client against mole serve: chat and completions,
// streaming and not, seeds, stop strings, and the client's errors for a bad
// request. Usage: node openai_client.mjs BASE_URL API_KEY ("none": the server has no key)
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    failures++;
    console.error("FAIL:", what);
  }
};

const models = await client.models.list();
check(models.data.length === 1 && typeof models.data[0].id === "string", "models.list gives one model");
const model = models.data[0].id;

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, seed: 7, temperature: 0.8 });
const text = chat.choices[0].message.content;
check(chat.object === "chat.completion" && chat.choices[0].message.role === "assistant", "chat completion shape");
check(chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= 12, "chat usage");
check(["stop", "length"].includes(chat.choices[0].finish_reason), "chat finish_reason");

// streaming: the deltas add up to the same text for the same seed
const stream = await client.chat.completions.create({ model, messages, max_tokens: 12, seed: 7, temperature: 0.8, stream: true });
let streamed = "", finish = null, chunks = 0;
for await (const ch of stream) {
  chunks++;
  streamed += ch.choices[0]?.delta?.content ?? "";
  finish = ch.choices[0]?.finish_reason ?? finish;
}
check(chunks >= 2 && streamed === text, `stream = non-stream text (${JSON.stringify(streamed)} vs ${JSON.stringify(text)})`);
check(finish === chat.choices[0].finish_reason, "stream finish_reason");

// completions, with logprobs
const cmp = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, seed: 3, logprobs: 2 });
check(cmp.object === "text_completion" && typeof cmp.choices[0].text === "string", "completion shape");
check(cmp.choices[0].logprobs.token_logprobs.length === cmp.usage.completion_tokens, "completion logprobs per token");
const cs = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, seed: 3, stream: true });
let ctext = "";
for await (const ch of cs) ctext += ch.choices[0]?.text ?? "";
check(ctext === cmp.choices[0].text, "completion stream = non-stream");

// a stop string taken from the text itself ends it there
if (text.length > 4) {
  const stop = text.slice(2, 4);
  const cut = await client.chat.completions.create({ model, messages, max_tokens: 12, seed: 7, temperature: 0.8, stop: [stop] });
  check(cut.choices[0].message.content === text.slice(0, text.indexOf(stop)) && cut.choices[0].finish_reason === "stop",
        "stop string");
}

// errors surface as the client's APIError with the status
try {
  await client.chat.completions.create({ model, messages, n: 2 });
  check(false, "n: 2 refused");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400 && /'n'/.test(e.message), `n: 2 -> 400 (${e.message})`);
}
if (apiKey !== "none") {  // "none": a server without --api-key
  try {
    await new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 }).models.list();
    check(false, "wrong key refused");
  } catch (e) {
    check(e.status === 401, "wrong key -> 401");
  }
}
console.log(failures ? `${failures} failure(s)` : "openai client: all checks passed");
process.exit(failures ? 1 : 0);
