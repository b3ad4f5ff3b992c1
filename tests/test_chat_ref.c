// tokenizer/chat, the families with reasoning (gpt-oss, GLM-4.5/4.7): prompts
// against the models' own templates as @huggingface/jinja renders them
// (tests/data/chat/*_cases.json and *_expected.json, see the README there),
// bad conversations, and the output parser (reasoning / content / tool calls)
// fed whole, byte by byte and cut at random, on well-formed and malformed output.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "tokenizer/chat.h"

static cJSON *read_json(const char *rel) {
  size_t n = 0;
  char *raw = tu_read_file(tu_path(rel), &n);
  if (!raw) fail_msg("cannot read %s", tu_path(rel));
  cJSON *j = cJSON_ParseWithLength(raw, n);
  free(raw);
  if (!j) fail_msg("%s: not JSON", rel);
  return j;
}

static const char *str_or_null(const cJSON *o, const char *k) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(x) ? x->valuestring : NULL;
}

// DeepSeek's and Gemma's templates open with the BOS, which mole leaves to the
// tokenizer (add_bos): it is compared less the BOS. DeepSeek's writes a system
// message bare; deepseek3 is llama.cpp's format, with "\n\n" after it: it is
// compared on the cases without one.
static const char *const k_bos[] = {"<｜begin▁of▁sentence｜>", "<bos>"};

static bool has_system(const cJSON *msgs) {
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) if (!strcmp(str_or_null(m, "role"), "system")) return true;
  return false;
}

static int check_reference(chat_tmpl tmpl, const char *cases_rel, const char *want_rel) {
  cJSON *cases = read_json(cases_rel);
  cJSON *want = read_json(want_rel);
  assert_int_equal(cJSON_GetArraySize(cases), cJSON_GetArraySize(want));
  int i = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, cases) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
    const int n = cJSON_GetArraySize(msgs);
    const cJSON *wj = cJSON_GetArrayItem(want, i);
    if (tmpl == CHAT_TMPL_DEEPSEEK3 && has_system(msgs)) {
      i++;
      continue;
    }
    chat_turn *t = calloc((size_t)n, sizeof *t);
    char **args = calloc((size_t)n, sizeof *args);
    int k = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
      t[k].role = str_or_null(m, "role");
      t[k].content = str_or_null(m, "content");
      t[k].reasoning = str_or_null(m, "reasoning");
      const cJSON *call = cJSON_GetObjectItemCaseSensitive(m, "tool_call");
      if (call) {
        t[k].tool_name = str_or_null(call, "name");
        args[k] = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(call, "arguments"));
        t[k].tool_args = args[k];
      }
      k++;
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(c, "tools");
    char *tools_s = tools ? cJSON_PrintUnformatted(tools) : NULL;
    chat_options opt = {.reasoning_effort = str_or_null(c, "reasoning_effort"),
                        .date = "2025-01-02",
                        .model_identity = str_or_null(c, "model_identity"),
                        .tools = tools_s,
                        .thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "no_thinking"))    ? CHAT_THINK_OFF
                                    : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "thinking")) ? CHAT_THINK_ON
                                                                                                    : CHAT_THINK_DEFAULT};
    const bool add = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
    char *out = NULL;
    const mole_status st = chat_format_turns(tmpl, t, n, add, &opt, &out);
    if (cJSON_IsNull(wj)) {  // the template refuses it
      if (st != MOLE_ERR_ARG) fail_msg("%s: case %d (%s): accepted", chat_template_name(tmpl), i, str_or_null(c, "name"));
    } else if (st != MOLE_OK) {
      fail_msg("%s: case %d (%s): %s", chat_template_name(tmpl), i, str_or_null(c, "name"), mole_last_error());
    }
    const char *w = wj->valuestring ? wj->valuestring : "";
    for (size_t b = 0; b < sizeof k_bos / sizeof k_bos[0]; b++)
      if ((tmpl == CHAT_TMPL_DEEPSEEK3 || tmpl == CHAT_TMPL_GEMMA4) && !strncmp(w, k_bos[b], strlen(k_bos[b])))
        w += strlen(k_bos[b]);
    if (out && strcmp(out, w)) {
      size_t at = 0;
      while (out[at] && out[at] == w[at]) at++;
      fail_msg("%s: case %d (%s) differs at byte %zu:\nwant: [%s]\ngot:  [%s]", chat_template_name(tmpl), i,
               str_or_null(c, "name"), at, w + at, out + at);
    }
    mole_free(out);
    for (int j = 0; j < n; j++) cJSON_free(args[j]);
    cJSON_free(tools_s);
    free(args);
    free(t);
    i++;
  }
  cJSON_Delete(cases);
  cJSON_Delete(want);
  return i;
}

static void test_reference_prompts(void **st) {
  (void)st;
  static const struct {
    chat_tmpl t;
    const char *cases, *want;
    int n;
  } sets[] = {
      {CHAT_TMPL_GPT_OSS, "harmony_cases.json", "harmony_expected.json", 12},
      {CHAT_TMPL_GLM45, "think_cases.json", "glm-4.6_expected.json", 8},
      {CHAT_TMPL_GLM47, "think_cases.json", "glm-4.7-flash_expected.json", 8},
      {CHAT_TMPL_QWEN3, "think_cases.json", "qwen3_expected.json", 8},
      {CHAT_TMPL_QWEN35, "think_cases.json", "qwen3.5_expected.json", 8},
      {CHAT_TMPL_DEEPSEEK3, "think_cases.json", "deepseek-v3_expected.json", 8},
      {CHAT_TMPL_GEMMA4, "think_cases.json", "gemma-4_expected.json", 8},
      {CHAT_TMPL_GEMMA4, "gemma_cases.json", "gemma-4_gemma_expected.json", 4},
  };
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
    char cases[128], want[128];
    snprintf(cases, sizeof cases, "tests/data/chat/%s", sets[i].cases);
    snprintf(want, sizeof want, "tests/data/chat/%s", sets[i].want);
    assert_int_equal(check_reference(sets[i].t, cases, want), sets[i].n);
  }
}

// Where the reference engine and Python's jinja2 (transformers) part: @huggingface/jinja
// ignores the argument of strip/lstrip/rstrip; mole follows Python, which strips only
// the characters named (Qwen3's content.lstrip('\n') keeps leading spaces).
static void test_python_strip(void **st) {
  (void)st;
  const chat_turn t[] = {{.role = "user", .content = "Q"}, {.role = "assistant", .content = "  A  ", .reasoning = " R\n"}};
  char *out = NULL;
  assert_int_equal(chat_format_turns(CHAT_TMPL_QWEN3, t, 2, false, NULL, &out), MOLE_OK);
  assert_string_equal(out, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n R\n</think>\n\n  A  <|im_end|>\n");
  mole_free(out);
}

// chat_format (role and content only) gives the same as chat_format_turns, with today's date.
static void test_plain_messages(void **st) {
  (void)st;
  const chat_msg conv[] = {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
  char date[16], *out = NULL;
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(date, sizeof date, "%Y-%m-%d", &tm);
  assert_int_equal(chat_format(CHAT_TMPL_GPT_OSS, conv, 4, true, &out), MOLE_OK);
  char want[1024];
  snprintf(want, sizeof want,
           "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
           "2024-06\nCurrent date: %s\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel "
           "must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nS\n\n<|end|>"
           "<|start|>user<|message|>U1<|end|><|start|>assistant<|channel|>final<|message|>A1<|end|><|start|>user"
           "<|message|>U2<|end|><|start|>assistant",
           date);
  if (strcmp(out, want)) {  // the date may have turned over midnight in between
    now = time(NULL);
    localtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%d", &tm);
    assert_non_null(strstr(out, date));
  }
  mole_free(out);
  // an empty conversation: the system message and the assistant prompt
  assert_int_equal(chat_format_turns(CHAT_TMPL_GPT_OSS, NULL, 0, true, &(chat_options){.date = "D"}, &out), MOLE_OK);
  assert_non_null(strstr(out, "Current date: D\n"));
  assert_non_null(strstr(out, "message.<|end|><|start|>assistant"));
  mole_free(out);
}

static void expect_error(chat_tmpl tmpl, const chat_turn *t, int64_t n, const chat_options *opt, const char *needle) {
  char *out = (char *)1;
  if (chat_format_turns(tmpl, t, n, true, opt, &out) != MOLE_ERR_ARG) fail_msg("accepted (%s)", needle);
  assert_null(out);
  if (!strstr(mole_last_error(), needle)) fail_msg("'%s' lacks '%s'", mole_last_error(), needle);
}

static void test_errors(void **st) {
  (void)st;
  const chat_turn role[] = {{.role = "user", .content = "hi"}, {.role = "narrator", .content = "x"}};
  expect_error(CHAT_TMPL_GPT_OSS, role, 2, NULL, "message 1 has role \"narrator\"");
  expect_error(CHAT_TMPL_GPT_OSS, (chat_turn[]){{.content = "x"}}, 1, NULL, "message 0 has no role");
  const chat_turn tags[] = {{.role = "assistant", .content = "a<|channel|>final<|message|>b"}};
  expect_error(CHAT_TMPL_GPT_OSS, tags, 1, NULL, "<|channel|> tags");
  const chat_turn rtags[] = {{.role = "assistant", .content = "ok", .reasoning = "<|channel|>analysis<|message|>"}};
  expect_error(CHAT_TMPL_GPT_OSS, rtags, 1, NULL, "assistant reasoning holds");
  const chat_turn orphan[] = {{.role = "user", .content = "hi"}, {.role = "tool", .content = "42"}};
  expect_error(CHAT_TMPL_GPT_OSS, orphan, 2, NULL, "message 1: a tool result with no assistant tool call");
  const chat_turn both[] = {{.role = "assistant", .content = "c", .reasoning = "r", .tool_name = "f"}};
  expect_error(CHAT_TMPL_GPT_OSS, both, 1, NULL, "both content and reasoning");
  const chat_turn args[] = {{.role = "assistant", .tool_name = "f", .tool_args = "{not json"}};
  expect_error(CHAT_TMPL_GPT_OSS, args, 1, NULL, "arguments are not JSON");
  const chat_turn ok[] = {{.role = "user", .content = "hi"}};
  expect_error(CHAT_TMPL_GPT_OSS, ok, 1, &(chat_options){.reasoning_effort = "max"}, "reasoning effort \"max\"");
  expect_error(CHAT_TMPL_GPT_OSS, ok, 1, &(chat_options){.tools = "{}"}, "tools: not a JSON array");
  expect_error(CHAT_TMPL_GPT_OSS, ok, 1, &(chat_options){.tools = "[{\"type\": \"function\"}]"}, "tools[0]");
  // the other families render role and content only
  const chat_turn dev[] = {{.role = "developer", .content = "x"}};
  expect_error(CHAT_TMPL_CHATML, dev, 1, NULL, "chatml takes system, user or assistant");
  const chat_turn call[] = {{.role = "assistant", .content = "", .tool_name = "f"}};
  expect_error(CHAT_TMPL_LLAMA3, call, 1, NULL, "only gpt-oss renders");
  expect_error(CHAT_TMPL_UNKNOWN, ok, 1, NULL, "--template");
  // and chat_turn there renders what chat_msg does
  char *a = NULL, *b = NULL;
  const chat_turn tt[] = {{.role = "system", .content = "S"}, {.role = "user", .content = "U"}};
  const chat_msg mm[] = {{"system", "S"}, {"user", "U"}};
  assert_int_equal(chat_format_turns(CHAT_TMPL_CHATML, tt, 2, true, NULL, &a), MOLE_OK);
  assert_int_equal(chat_format(CHAT_TMPL_CHATML, mm, 2, true, &b), MOLE_OK);
  assert_string_equal(a, b);
  mole_free(a);
  mole_free(b);
}

// ---- the output parser ----------------------------------------------------------------

typedef struct {
  char part[4][512];
  size_t n[4];
  int names;  // TOOL_NAME emits
} parts;

static void collect(void *ud, chat_part part, const char *s, size_t n) {
  parts *p = ud;
  assert_true(p->n[part] + n < sizeof p->part[part]);
  memcpy(p->part[part] + p->n[part], s, n);
  p->n[part] += n;
  p->part[part][p->n[part]] = 0;
  if (part == CHAT_PART_TOOL_NAME) p->names++;
}

static bool g_in_thinking;  // run_parser: the prompt ended inside <think>

// cut: 0 whole, 1 byte by byte, else random pieces (seeded by cut)
static parts run_parser(chat_tmpl tmpl, const char *text, uint64_t cut) {
  parts p;
  memset(&p, 0, sizeof p);
  chat_parser *ps = NULL;
  assert_int_equal(chat_parser_new(tmpl, &ps), MOLE_OK);
  if (g_in_thinking) chat_parser_in_thinking(ps);
  const size_t n = strlen(text);
  uint64_t rng = cut;
  for (size_t at = 0; at < n;) {
    size_t k = cut == 0 ? n : cut == 1 ? 1 : 1 + tu_rand_u64(&rng) % 16;
    k = k > n - at ? n - at : k;
    chat_parser_feed(ps, text + at, k, collect, &p);
    at += k;
  }
  chat_parser_finish(ps, collect, &p);
  chat_parser_free(ps);
  return p;
}

typedef struct {
  const char *out, *reasoning, *content, *tool_name, *tool_args;
} parse_case;

static void check_parse(chat_tmpl tmpl, const parse_case *c) {
  for (uint64_t cut = 0; cut < 12; cut++) {
    parts p = run_parser(tmpl, c->out, cut);
    const char *want[4] = {c->content, c->reasoning, c->tool_name, c->tool_args};
    static const char *const names[4] = {"content", "reasoning", "tool name", "tool args"};
    for (int k = 0; k < 4; k++)
      if (strcmp(p.part[k], want[k] ? want[k] : ""))
        fail_msg("'%s' (cut %llu): %s is [%s], want [%s]", c->out, (unsigned long long)cut, names[k], p.part[k],
                 want[k] ? want[k] : "");
    assert_int_equal(p.names, c->tool_name ? 1 : 0);
  }
}

static void test_parser(void **st) {
  (void)st;
  static const parse_case cases[] = {
      // what gpt-oss writes after "<|start|>assistant"
      {"<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>4",
       "User asks 2+2. Answer 4.", "4", NULL, NULL},
      {"<|channel|>final<|message|>Just the answer, < and <| and <|end and |> kept.", NULL,
       "Just the answer, < and <| and <|end and |> kept.", NULL, NULL},
      {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
       "<|start|>assistant<|channel|>final<|message|>c<|return|>",
       "ab", "c", NULL, NULL},
      // tool calls: the recipient after the channel, or in the role part
      {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
       "Need weather.", NULL, "get_weather", "{\"city\":\"Paris\"}"},
      {" to=functions.lookup<|channel|>commentary json<|message|>{}", NULL, NULL, "lookup", "{}"},
      {"<|channel|>commentary to=browser.search<|message|>{\"q\":1}", NULL, NULL, "browser.search", "{\"q\":1}"},
      // a preamble (commentary to nobody) is content
      {"<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>Done.", NULL,
       "Let me check.Done.", NULL, NULL},
      // a header again without <|end|>, and a stray <|start|>
      {"<|channel|>analysis<|message|>x<|channel|>final<|message|>y", "x", "y", NULL, NULL},
      {"<|start|>assistant<|channel|>final<|message|>z", NULL, "z", NULL, NULL},
      // malformed: the text goes to content, markers included
      {"Hello there, no header at all!", NULL, "Hello there, no header at all!", NULL, NULL},
      {"<|channel|>bogus<|message|>text", NULL, "<|channel|>bogus<|message|>text", NULL, NULL},
      {"assistant<|message|>no channel", NULL, "assistant<|message|>no channel", NULL, NULL},
      {"<|channel|>final<|end|>after", NULL, "<|channel|>final<|end|>after", NULL, NULL},
      {"<|channel|>fin", NULL, "<|channel|>fin", NULL, NULL},
      {"<|chan", NULL, "<|chan", NULL, NULL},
      {"<|channel|>analysis<|message|>cut off <|en", "cut off <|en", NULL, NULL, NULL},
      {"<|channel|>final<|message|>a<|end|>stray text", NULL, "astray text", NULL, NULL},
      {"<|channel|>final<|message|>a<|end|><|message|>", NULL, "a<|message|>", NULL, NULL},
      {"", NULL, NULL, NULL, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_parse(CHAT_TMPL_GPT_OSS, &cases[i]);
  // a header that never ends: content once it is too long to be one
  char longh[400] = "<|channel|>";
  memset(longh + 11, 'a', 300);
  longh[311] = 0;
  parse_case lc = {longh, NULL, longh, NULL, NULL};
  check_parse(CHAT_TMPL_GPT_OSS, &lc);
  // families without reasoning: everything is content, markers or not
  parse_case plain = {"<|channel|>analysis<|message|>x", NULL, "<|channel|>analysis<|message|>x", NULL, NULL};
  check_parse(CHAT_TMPL_CHATML, &plain);
  assert_true(chat_template_has_reasoning(CHAT_TMPL_GPT_OSS));
  assert_false(chat_template_has_reasoning(CHAT_TMPL_LLAMA3));
}

// <think>...</think>: DeepSeek-R1, GLM-4.5+, Qwen3.
static void test_parser_think(void **st) {
  (void)st;
  char spaced[256] = "<think>a", spaced_r[256] = "a";
  memset(spaced + 8, ' ', 100);
  strcpy(spaced + 108, "b</think>c");
  memset(spaced_r + 1, ' ', 100);
  strcpy(spaced_r + 101, "b");
  const parse_case cases[] = {
      {"<think>\nLet me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4.", NULL, NULL},
      {"  \n<think>x</think>y", "x", "y", NULL, NULL},
      {"\n<think></think>\nGLM's empty thinking", NULL, "GLM's empty thinking", NULL, NULL},
      {"No thinking here.", NULL, "No thinking here.", NULL, NULL},
      {"  leading spaces kept, <think> here is text", NULL, "  leading spaces kept, <think> here is text", NULL, NULL},
      {"<think>unfinished", "unfinished", NULL, NULL, NULL},
      {"<think>a</think>b</think>c<think>d", "a", "b</think>c<think>d", NULL, NULL},
      {"<thin", NULL, "<thin", NULL, NULL},
      {"<think>  spaced   out  \n</think>   \n answer  ", "spaced   out", "answer  ", NULL, NULL},
      {"   ", NULL, "   ", NULL, NULL},
      {spaced, spaced_r, "c", NULL, NULL},
      {"", NULL, NULL, NULL, NULL},
  };
  static const chat_tmpl fams[] = {CHAT_TMPL_DEEPSEEK3, CHAT_TMPL_GLM45, CHAT_TMPL_GLM47, CHAT_TMPL_CHATML,
                                   CHAT_TMPL_QWEN3,     CHAT_TMPL_QWEN35};
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
    assert_true(chat_template_has_reasoning(fams[f]));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_parse(fams[f], &cases[i]);
  }
  // Gemma 4's thought channel
  const parse_case gemma[] = {
      {"<|channel>thought\nThe user greets.<channel|>Hello!", "The user greets.", "Hello!", NULL, NULL},
      {"<|channel>other<channel|>x", NULL, "<|channel>other<channel|>x", NULL, NULL},
      {"Plain answer <think>x</think>", NULL, "Plain answer <think>x</think>", NULL, NULL},
      {"<|channel>thought\nnever closed", "never closed", NULL, NULL, NULL},
  };
  for (size_t i = 0; i < sizeof gemma / sizeof gemma[0]; i++) check_parse(CHAT_TMPL_GEMMA4, &gemma[i]);
  // the prompt ended with <think> (GLM-4.7): reasoning until </think>
  g_in_thinking = true;
  const parse_case inside[] = {
      {"\nreasoning here\n</think>answer", "reasoning here", "answer", NULL, NULL},
      {"never closed", "never closed", NULL, NULL, NULL},
      {"<think>nested</think>x", "<think>nested", "x", NULL, NULL},
  };
  for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++) check_parse(CHAT_TMPL_GLM47, &inside[i]);
  parse_case harmony = {"<|channel|>final<|message|>x", NULL, "x", NULL, NULL};  // no effect there
  check_parse(CHAT_TMPL_GPT_OSS, &harmony);
  g_in_thinking = false;
}

// Random mixes of markers and text: never a crash, and every byte of text
// that is no marker comes out exactly once, in its part.
static void test_parser_fuzz(void **st) {
  (void)st;
  static const char *const bits[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>",
                                     "<|return|>", "<|call|>", "analysis", "final", "commentary", " to=functions.f",
                                     "assistant", "json", "<", "|", ">", "<|", "|>", "x", " ", "\n", "é", "{\"a\":1}",
                                     "<think>", "</think>", "<th", "</", "\t", "<|channel>thought",
                                     "<|channel>", "<channel|>", "thought"};
  uint64_t rng = 7;
  char text[512];
  for (int it = 0; it < 3000; it++) {
    size_t n = 0;
    const int k = 1 + (int)(tu_rand_u64(&rng) % 24);
    for (int j = 0; j < k; j++) {
      const char *b = bits[tu_rand_u64(&rng) % (sizeof bits / sizeof bits[0])];
      memcpy(text + n, b, strlen(b));
      n += strlen(b);
    }
    text[n] = 0;
    static const chat_tmpl fz[] = {CHAT_TMPL_GPT_OSS, CHAT_TMPL_DEEPSEEK3, CHAT_TMPL_GEMMA4};
    const chat_tmpl tmpl = fz[it % 3];
    parts whole = run_parser(tmpl, text, 0);
    for (uint64_t cut = 1; cut < 4; cut++) {
      parts p = run_parser(tmpl, text, cut + (uint64_t)it * 4);
      for (int q = 0; q < 4; q++)
        if (strcmp(p.part[q], whole.part[q])) fail_msg("'%s': part %d depends on the cuts", text, q);
    }
    size_t total = 0;
    for (int q = 0; q < 4; q++) total += whole.n[q];
    assert_true(total <= n);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_prompts), cmocka_unit_test(test_python_strip),
      cmocka_unit_test(test_plain_messages),
      cmocka_unit_test(test_errors),            cmocka_unit_test(test_parser),
      cmocka_unit_test(test_parser_think),      cmocka_unit_test(test_parser_fuzz),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
