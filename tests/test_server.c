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
  char *s = srv_api_chunk(&c, r, 0, 0, 0, 0, true, NULL);
  assert_true(!strncmp(s, "data: {", 7) && strstr(s, "\"role\":\"assistant\"") && !strcmp(s + strlen(s) - 2, "\n\n"));
  mole_free(s);
  s = srv_api_chunk(&c, r, 2, 5, 0, 0, false, "length");
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

int main(void) {
  gguf_file *f;
  if (gguf_open(tu_path("tests/data/conformance/tokenizer/ggml-vocab-llama-spm.gguf"), &f) || tok_load(f, &g_voc)) {
    fprintf(stderr, "vocab: %s\n", mole_last_error());
    return 1;
  }
  gguf_close(f);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_utf8), cmocka_unit_test(test_parse), cmocka_unit_test(test_shapes)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tok_free(g_voc);
  return rc;
}
