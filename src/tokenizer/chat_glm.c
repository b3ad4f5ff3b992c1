// tokenizer/chat_glm: GLM-4.5/4.6 and GLM-4.7 prompts, byte for byte what
// the models' Jinja templates (tests/data/chat/glm-4.6.jinja,
// glm-4.7-flash.jinja) render: an assistant's reasoning is shown only after
// the last user message (earlier ones get an empty think block), taken from
// its reasoning or else from "<think>...</think>" in its content; content
// and reasoning are stripped of surrounding whitespace.
#include <string.h>

#include "tokenizer/chat_internal.h"

static bool glm_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// s[0..n) without whitespace at both ends: *a, *an.
static void glm_strip(const char *s, size_t n, const char **a, size_t *an) {
  while (n > 0 && glm_space(*s)) s++, n--;
  while (n > 0 && glm_space(s[n - 1])) n--;
  *a = s;
  *an = n;
}

// The template's reasoning and content of an assistant turn.
static void glm_split(const chat_turn *t, const char **r, size_t *rn, const char **c, size_t *cn) {
  const char *content = t->content ? t->content : "";
  *c = content;
  *cn = strlen(content);
  *r = t->reasoning ? t->reasoning : "";
  *rn = strlen(*r);
  const char *end = strstr(content, "</think>");
  if (t->reasoning || !end) return;
  // reasoning: before the first </think>, right-trimmed of newlines, after its last <think>, left-trimmed
  const char *a = content, *e = end;
  while (e > a && e[-1] == '\n') e--;
  for (const char *q = a; (q = strstr(q, "<think>")) && q < e; q += 7) a = q + 7;
  if (a > e) a = e;
  while (a < e && *a == '\n') a++;
  *r = a;
  *rn = (size_t)(e - a);
  // content: after the last </think>, left-trimmed of newlines
  const char *last = end;
  for (const char *q = end; (q = strstr(q + 1, "</think>"));) last = q;
  *c = last + 8;
  while (**c == '\n') (*c)++;
  *cn = strlen(*c);
}

mole_status chat_glm_render(chat_buf *b, bool v47, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt) {
  const bool no_think = opt && opt->thinking == CHAT_THINK_OFF;
  const char *nl = v47 ? "" : "\n";
  int64_t last_user = -1;
  for (int64_t i = 0; i < n; i++)
    if (!strcmp(t[i].role, "user")) last_user = i;
  chat_put(b, "[gMASK]<sop>");
  for (int64_t i = 0; i < n; i++) {
    const char *role = t[i].role, *content = t[i].content ? t[i].content : "";
    if (!strcmp(role, "user")) {
      chat_put(b, "<|user|>");
      chat_put(b, nl);
      chat_put(b, content);
      const size_t cl = strlen(content);
      if (!v47 && no_think && !(cl >= 8 && !strcmp(content + cl - 8, "/nothink"))) chat_put(b, "/nothink");
    } else if (!strcmp(role, "system")) {
      chat_put(b, "<|system|>");
      chat_put(b, nl);
      chat_put(b, content);
    } else if (!strcmp(role, "assistant")) {
      const char *r, *c, *rs, *cs;
      size_t rn, cn, rsn, csn;
      glm_split(&t[i], &r, &rn, &c, &cn);
      glm_strip(r, rn, &rs, &rsn);
      glm_strip(c, cn, &cs, &csn);
      chat_put(b, "<|assistant|>");
      if (i > last_user && rn > 0) {
        chat_put(b, nl);
        chat_put(b, "<think>");
        chat_put_n(b, rs, rsn);
        chat_put(b, "</think>");
      } else {
        chat_put(b, v47 ? "</think>" : "\n<think></think>");
      }
      if (csn > 0) {
        chat_put(b, nl);
        chat_put_n(b, cs, csn);
      }
    }
  }
  if (add_ass) {
    chat_put(b, "<|assistant|>");
    if (v47) chat_put(b, no_think ? "</think>" : "<think>");
    else if (no_think) chat_put(b, "\n<think></think>");
  }
  return MOLE_OK;
}
