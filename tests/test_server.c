// server units: UTF-8 repair of streamed bytes, request parsing (types,
// ranges, chat templates, limits) and the JSON shapes of responses, stream
// chunks and errors. The HTTP server itself is tested with real clients in
// tests/cli_serve.sh.
#include <cjson/cJSON.h>
#include <string.h>

#include "gguf/gguf.h"
#include "server/server_internal.h"
#include "testutil.h"

// feeds the pieces one after another; returns the text (static buffer)
static const char *take_all(const char *const *pieces, int n, int *held) {
  static char out[4096];
  char hold[4];
  int nh = 0;
  size_t o = 0;
  for (int i = 0; i < n; i++) o += srv_utf8_take(hold, &nh, pieces[i], strlen(pieces[i]), out + o);
  out[o] = 0;
  *held = nh;
  return out;
}

static void test_utf8(void **st) {
  (void)st;
  int held;
  const char *ok[] = {"h\xC3", "\xA9llo \xE2\x82", "\xAC \xF0\x9F\x98\x80"};
  assert_string_equal(take_all(ok, 3, &held), "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80");
  assert_int_equal(held, 0);
  const char *cut[] = {"ab\xE2\x82"};  // incomplete at the end: held, not emitted
  assert_string_equal(take_all(cut, 1, &held), "ab");
  assert_int_equal(held, 2);
  const char *stray[] = {"\xB9x", "\xC3(", "\xFF", "\xE0\x80\x80", "\xED\xA0\x80", "\xC0\xAF"};
  // every byte that starts or continues nothing valid is one U+FFFD
  assert_string_equal(take_all(stray, 6, &held),
                      "\xEF\xBF\xBDx\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                      "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  assert_int_equal(held, 0);
}

static tok_vocab *g_voc;

static srv_api_ctx ctx(void) {
  return (srv_api_ctx){g_voc, CHAT_TMPL_CHATML, "test-model", 100, 50};
}

static srv_req *parse(bool chat, const char *body, char *err) {
  srv_api_ctx c = ctx();
  return srv_api_parse(&c, chat, body, strlen(body), err, 256);
}

static void bad(bool chat, const char *body, const char *needle) {
  char err[256] = "";
  srv_req *r = parse(chat, body, err);
  if (r) fail_msg("accepted: %s", body);
  if (!strstr(err, needle)) fail_msg("%s: message '%s' lacks '%s'", body, err, needle);
}

static void test_parse(void **st) {
  (void)st;
  char err[256];
  srv_req *r = parse(true,
                     "{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
                     "[{\"type\":\"text\",\"text\":\"Hi\"}]}],\"temperature\":0.5,\"top_k\":7,\"seed\":42,\"max_tokens\":"
                     "1000,\"stop\":\"END\",\"stream\":true,\"logprobs\":true,\"top_logprobs\":3}",
                     err);
  if (!r) fail_msg("%s", err);
  assert_true(r->chat && r->stream);
  assert_int_equal(r->max_tokens, 100);  // capped at the server's limit
  assert_int_equal(r->n_stops, 1);
  assert_string_equal(r->stops[0], "END");
  assert_int_equal(r->top_logprobs, 3);
  assert_true(r->sp.temperature == 0.5f && r->sp.top_k == 7 && r->sp.seed == 42);
  assert_true(r->n_prompt > 4);  // the chatml rendering, tokenized
  srv_req_release(r);
  // token ids as a completion prompt; a one-element batch of strings
  r = parse(false, "{\"prompt\":[1,2,3],\"logprobs\":2}", err);
  assert_non_null(r);
  assert_int_equal(r->n_prompt, 3);
  assert_int_equal(r->top_logprobs, 2);
  srv_req_release(r);
  r = parse(false, "{\"prompt\":[\"once\"]}", err);
  assert_non_null(r);
  srv_req_release(r);

  bad(true, "{", "not a JSON object");
  bad(true, "{\"messages\":[]}", "'messages'");
  bad(true, "{\"messages\":[{\"role\":\"user\"}]}", "content");
  bad(true, "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", "role");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "text");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}", "'temperature'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":\"a\"}", "'top_p'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", "'max_tokens'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", "'n'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", "'stream'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", "'stop'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "'logprobs'");
  bad(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":3}", "'model'");
  bad(false, "{\"prompt\":7}", "'prompt'");
  bad(false, "{\"prompt\":[1,-2]}", "token id");
  bad(false, "{\"prompt\":\"x\",\"echo\":true}", "echo");
  bad(false, "{\"prompt\":[]}", "'prompt'");
  char longp[4096] = "{\"prompt\":\"";
  for (int i = 0; i < 200; i++) strcat(longp, "word ");
  strcat(longp, "\"}");
  bad(false, longp, "prompt has");  // more than max_prompt (50) tokens
}

static void test_shapes(void **st) {
  (void)st;
  char err[256];
  srv_req *r = parse(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}", err);
  assert_non_null(r);
  r->text = mole_strdup("Hello");
  r->n_text = 5;
  r->n_gen = 2;
  r->finish = "stop";
  srv_api_ctx c = ctx();
  char *j = srv_api_response(&c, r);
  cJSON *o = cJSON_Parse(j);
  assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
  const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")->valuestring, "Hello");
  assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")->valueint, 2);
  cJSON_Delete(o);
  mole_free(j);
  // stream chunks: the opening one carries the role, the last the finish reason
  char *s = srv_api_chunk(&c, r, &(srv_span){0}, true, NULL);
  assert_true(!strncmp(s, "data: {", 7) && strstr(s, "\"role\":\"assistant\"") && !strcmp(s + strlen(s) - 2, "\n\n"));
  mole_free(s);
  s = srv_api_chunk(&c, r, &(srv_span){.from = 2, .to = 5}, false, "length");
  o = cJSON_Parse(s + 6);
  ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content")->valuestring, "llo");
  assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "length");
  cJSON_Delete(o);
  mole_free(s);
  srv_req_release(r);
  const int codes[] = {400, 401, 404, 405, 413, 503, 500};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    char *e = srv_api_error(codes[i], "why \"quoted\"");
    o = cJSON_Parse(e);
    const cJSON *er = cJSON_GetObjectItem(o, "error");
    assert_string_equal(cJSON_GetObjectItem(er, "message")->valuestring, "why \"quoted\"");
    assert_true(cJSON_IsString(cJSON_GetObjectItem(er, "type")) && cJSON_IsString(cJSON_GetObjectItem(er, "code")));
    cJSON_Delete(o);
    mole_free(e);
  }
}

// gpt-oss: developer, reasoning, tool turns and the reasoning effort reach the
// harmony prompt; the output is split (reasoning_content beside content), in
// whole responses and in stream chunks.
static void test_harmony(void **st) {
  (void)st;
  srv_api_ctx c = {g_voc, CHAT_TMPL_GPT_OSS, "gpt-oss", 100, 4000};
  char err[256] = "";
  const char *body =
      "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Weather?\"},"
      "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Call it.\",\"tool_calls\":[{\"id\":\"c1\","
      "\"type\":\"function\",\"function\":{\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"-3 C\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"description\":\"Weather now\","
      "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
      "\"chat_template_kwargs\":{\"reasoning_effort\":\"high\"}}";
  srv_req *r = srv_api_parse(&c, true, body, strlen(body), err, sizeof err);
  if (!r) fail_msg("%s", err);
  assert_int_equal(r->split, CHAT_TMPL_GPT_OSS);
  char *prompt = NULL;
  size_t pn = 0;
  assert_int_equal(tok_decode(g_voc, r->prompt, r->n_prompt, TOK_DECODE_STRIP_SPACE, &prompt, &pn), MOLE_OK);
  static const char *const want[] = {
      "Reasoning: high", "# Instructions\n\nBe brief.", "type weather = (_: {\ncity?: string,\n}) => any;",
      "<|start|>assistant<|channel|>analysis<|message|>Call it.<|end|>",
      "<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|>",
      "<|start|>functions.weather to=assistant<|channel|>commentary<|message|>\"-3 C\"<|end|><|start|>assistant"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(prompt, want[i])) fail_msg("the prompt lacks [%s]:\n%s", want[i], prompt);
  mole_free(prompt);

  // the engine's output: reasoning and content apart
  r->text = mole_strdup("4");
  r->n_text = 1;
  r->reasoning = mole_strdup("2+2 is 4.");
  r->n_reasoning = 9;
  r->finish = "stop";
  char *j = srv_api_response(&c, r);
  cJSON *o = cJSON_Parse(j);
  const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
  assert_string_equal(cJSON_GetObjectItem(msg, "content")->valuestring, "4");
  assert_string_equal(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "2+2 is 4.");
  cJSON_Delete(o);
  mole_free(j);
  // chunks: reasoning only (no content key), then content only
  char *s = srv_api_chunk(&c, r, &(srv_span){.rto = 4}, false, NULL);
  o = cJSON_Parse(s + 6);
  const cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
  assert_string_equal(cJSON_GetObjectItem(d, "reasoning_content")->valuestring, "2+2 ");
  assert_null(cJSON_GetObjectItem(d, "content"));
  cJSON_Delete(o);
  mole_free(s);
  s = srv_api_chunk(&c, r, &(srv_span){.to = 1, .rfrom = 9, .rto = 9}, false, "stop");
  o = cJSON_Parse(s + 6);
  d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
  assert_string_equal(cJSON_GetObjectItem(d, "content")->valuestring, "4");
  assert_null(cJSON_GetObjectItem(d, "reasoning_content"));
  assert_null(cJSON_GetObjectItem(d, "tool_calls"));
  cJSON_Delete(o);
  mole_free(s);

  // a tool call (gpt-oss's commentary to functions.NAME): tool_calls, finish_reason tool_calls
  snprintf(r->tool_name, sizeof r->tool_name, "weather");
  r->tool_args = mole_strdup("{\"city\":\"Oslo\"}");
  r->n_tool_args = strlen(r->tool_args);
  r->finish = "tool_calls";
  j = srv_api_response(&c, r);
  o = cJSON_Parse(j);
  const cJSON *ch0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(ch0, "message"), "tool_calls"), 0);
  assert_string_equal(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
  assert_true(!strncmp(cJSON_GetObjectItem(tc, "id")->valuestring, "call_", 5));
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "name")->valuestring, "weather");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "arguments")->valuestring,
                      "{\"city\":\"Oslo\"}");
  assert_string_equal(cJSON_GetObjectItem(ch0, "finish_reason")->valuestring, "tool_calls");
  cJSON_Delete(o);
  mole_free(j);
  // streamed: the head (id, type, name) once, then arguments in pieces
  s = srv_api_chunk(&c, r, &(srv_span){.tool_head = true, .tto = 3}, false, NULL);
  o = cJSON_Parse(s + 6);
  d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
  tc = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "tool_calls"), 0);
  assert_int_equal(cJSON_GetObjectItem(tc, "index")->valueint, 0);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "name")->valuestring, "weather");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "arguments")->valuestring, "{\"c");
  cJSON_Delete(o);
  mole_free(s);
  s = srv_api_chunk(&c, r, &(srv_span){.tfrom = 3, .tto = r->n_tool_args}, false, "tool_calls");
  o = cJSON_Parse(s + 6);
  d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
  tc = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "tool_calls"), 0);
  assert_null(cJSON_GetObjectItem(tc, "id"));
  assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "name"));
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "arguments")->valuestring,
                      "ity\":\"Oslo\"}");
  cJSON_Delete(o);
  mole_free(s);
  srv_req_release(r);

  // bad requests name what is wrong
  static const struct {
    const char *body, *needle;
  } bads[] = {
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"max\"}", "reasoning effort \"max\""},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":3}", "'reasoning_effort'"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "'tools'"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"y\"}]}", "no assistant tool call"},
      {"{\"messages\":[{\"role\":\"narrator\",\"content\":\"x\"}]}", "expected system, developer, user, tool"},
      {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":7}}]}]}", "tool_calls"},
      {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":[]}]}", "reasoning_content"},
  };
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
    err[0] = 0;
    r = srv_api_parse(&c, true, bads[i].body, strlen(bads[i].body), err, sizeof err);
    if (r) fail_msg("accepted: %s", bads[i].body);
    if (!strstr(err, bads[i].needle)) fail_msg("%s: message '%s' lacks '%s'", bads[i].body, err, bads[i].needle);
  }
  // GLM-4.7: the prompt ends inside <think>, history reasoning reaches the prompt, thinking can be turned off
  c.tmpl = CHAT_TMPL_GLM47;
  const char *glm = "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"A\","
                    "\"reasoning_content\":\"R\"}]}";
  r = srv_api_parse(&c, true, glm, strlen(glm), err, sizeof err);
  if (!r) fail_msg("%s", err);
  assert_int_equal(r->split, CHAT_TMPL_GLM47);
  assert_true(r->split_thinking);
  assert_int_equal(tok_decode(g_voc, r->prompt, r->n_prompt, TOK_DECODE_STRIP_SPACE, &prompt, &pn), MOLE_OK);
  assert_non_null(strstr(prompt, "<|assistant|><think>R</think>A<|assistant|><think>"));
  mole_free(prompt);
  srv_req_release(r);
  const char *off = "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}";
  r = srv_api_parse(&c, true, off, strlen(off), err, sizeof err);
  if (!r) fail_msg("%s", err);
  assert_false(r->split_thinking);
  srv_req_release(r);
  const char *badkw = "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"chat_template_kwargs\":{\"enable_thinking\":1}}";
  assert_null(srv_api_parse(&c, true, badkw, strlen(badkw), err, sizeof err));
  assert_non_null(strstr(err, "'enable_thinking'"));
  // templates without reasoning: no split, tool turns refused
  c.tmpl = CHAT_TMPL_LLAMA3;
  const char *plain = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
  r = srv_api_parse(&c, true, plain, strlen(plain), err, sizeof err);
  assert_non_null(r);
  assert_int_equal(r->split, CHAT_TMPL_UNKNOWN);
  srv_req_release(r);
  const char *tool = "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}";
  assert_null(srv_api_parse(&c, true, tool, strlen(tool), err, sizeof err));
}

int main(void) {
  gguf_file *f;
  if (gguf_open(tu_path("tests/data/conformance/tokenizer/ggml-vocab-llama-spm.gguf"), &f) || tok_load(f, &g_voc)) {
    fprintf(stderr, "vocab: %s\n", mole_last_error());
    return 1;
  }
  gguf_close(f);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_utf8), cmocka_unit_test(test_parse), cmocka_unit_test(test_shapes),
                                     cmocka_unit_test(test_harmony)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tok_free(g_voc);
  return rc;
}
