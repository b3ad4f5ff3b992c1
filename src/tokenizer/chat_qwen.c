// tokenizer/chat_qwen: Qwen3 and Qwen3.5 prompts (ChatML with thinking),
// byte for byte what the models' Jinja templates (tests/data/chat/qwen3.jinja,
// qwen3.5.jinja) render: an assistant turn after the last user query shows
// its reasoning in <think>...</think> (Qwen3: the last turn, or one with
// reasoning; Qwen3.5: every one), earlier ones their content only; the
// reasoning comes from the turn's reasoning or from <think>...</think> in its
// content. Qwen3.5 trims every message, wants system first and a user query,
// and opens the answer with <think>.
#include <stdint.h>
#include <string.h>

#include "tokenizer/chat_internal.h"

static bool qw_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

typedef struct {
  const char *p;
  size_t n;
} qw_str;

static qw_str qw_trim(qw_str s, bool spaces) {  // spaces: Jinja's trim; else newlines only (strip('\n'))
  while (s.n > 0 && (spaces ? qw_space(*s.p) : *s.p == '\n')) s.p++, s.n--;
  while (s.n > 0 && (spaces ? qw_space(s.p[s.n - 1]) : s.p[s.n - 1] == '\n')) s.n--;
  return s;
}

static qw_str qw_of(const char *s) { return (qw_str){s ? s : "", s ? strlen(s) : 0}; }

static bool qw_find(qw_str s, const char *needle, size_t from, size_t *at) {
  const size_t k = strlen(needle);
  for (size_t i = from; i + k <= s.n; i++)
    if (!memcmp(s.p + i, needle, k)) {
      *at = i;
      return true;
    }
  return false;
}

// reasoning and content of an assistant turn, as the templates split them
static void qw_split(const chat_turn *t, qw_str content, qw_str *r, qw_str *c) {
  *c = content;
  *r = qw_of(t->reasoning);
  size_t first;
  if (t->reasoning || !qw_find(content, "</think>", 0, &first)) return;
  qw_str before = {content.p, first};
  while (before.n > 0 && before.p[before.n - 1] == '\n') before.n--;
  size_t at, from = 0, open = SIZE_MAX;  // after the last <think>
  while (qw_find(before, "<think>", from, &at)) open = at, from = at + 1;
  if (open != SIZE_MAX) before = (qw_str){before.p + open + 7, before.n - open - 7};
  while (before.n > 0 && *before.p == '\n') before.p++, before.n--;
  *r = before;
  size_t last = first;
  while (qw_find(content, "</think>", last + 1, &at)) last = at;
  qw_str after = {content.p + last + 8, content.n - last - 8};
  while (after.n > 0 && *after.p == '\n') after.p++, after.n--;
  *c = after;
}

mole_status chat_qwen_render(chat_buf *b, bool v35, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt) {
  const bool no_think = opt && opt->thinking == CHAT_THINK_OFF;
  // the last user query (a user turn that is not a wrapped tool response)
  int64_t last_query = n - 1;
  bool found = false;
  for (int64_t i = n - 1; i >= 0 && !found; i--) {
    if (strcmp(t[i].role, "user")) continue;
    qw_str c = qw_of(t[i].content);
    if (v35) c = qw_trim(c, true);
    const bool wrapped = c.n >= 31 && !memcmp(c.p, "<tool_response>", 15) && !memcmp(c.p + c.n - 16, "</tool_response>", 16);
    if (!wrapped) last_query = i, found = true;
  }
  if (v35 && !found) return mole_errorf(MOLE_ERR_ARG, "chat: qwen3.5 needs a user message (its template's rule)");
  if (n > 0 && !strcmp(t[0].role, "system")) {
    qw_str c = qw_of(t[0].content);
    if (v35) c = qw_trim(c, true);
    chat_put(b, "<|im_start|>system\n");
    chat_put_n(b, c.p, c.n);
    chat_put(b, "<|im_end|>\n");
  }
  for (int64_t i = 0; i < n; i++) {
    qw_str c = qw_of(t[i].content);
    if (v35) c = qw_trim(c, true);
    if (!strcmp(t[i].role, "system")) {
      if (i == 0) continue;
      if (v35) return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: qwen3.5 takes a system message first only", (long long)i);
    }
    if (strcmp(t[i].role, "assistant")) {  // user, or a later system message (Qwen3)
      chat_put(b, "<|im_start|>");
      chat_put(b, t[i].role);
      chat_put(b, "\n");
      chat_put_n(b, c.p, c.n);
      chat_put(b, "<|im_end|>\n");
      continue;
    }
    qw_str r, a;
    qw_split(&t[i], c, &r, &a);
    if (v35) r = qw_trim(r, true);
    chat_put(b, "<|im_start|>assistant\n");
    if (i > last_query && (v35 || i == n - 1 || r.n > 0)) {
      if (!v35) r = qw_trim(r, false);
      chat_put(b, "<think>\n");
      chat_put_n(b, r.p, r.n);
      chat_put(b, "\n</think>\n\n");
      if (!v35)
        while (a.n > 0 && *a.p == '\n') a.p++, a.n--;
    }
    chat_put_n(b, a.p, a.n);
    chat_put(b, "<|im_end|>\n");
  }
  if (add_ass) {
    chat_put(b, "<|im_start|>assistant\n");
    if (no_think) chat_put(b, "<think>\n\n</think>\n\n");
    else if (v35) chat_put(b, "<think>\n");
  }
  return MOLE_OK;
}
