// tokenizer/chat_gemma: Gemma 4 prompts, byte for byte what the model's Jinja
// template (tests/data/chat/gemma-4.jinja) renders for system, developer,
// user and assistant turns: <|turn>role\n...<turn|>\n, assistant as "model"
// (a second answer in a row continues the same turn), the first system or
// developer message with <|think|> when thinking is on, an answer's thinking
// (<|channel>...<channel|>) stripped from the history, and an empty thought
// channel opening the answer unless thinking is on.
#include <string.h>

#include "tokenizer/chat_internal.h"

static bool gm_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void gm_put_trimmed(chat_buf *b, const char *s, size_t n) {
  while (n > 0 && gm_space(*s)) s++, n--;
  while (n > 0 && gm_space(s[n - 1])) n--;
  chat_put_n(b, s, n);
}

// The template's strip_thinking: the parts between <channel|> marks, each cut
// at its <|channel>, joined and trimmed.
static void gm_put_answer(chat_buf *b, const char *s) {
  chat_buf t = {0};
  chat_put(&t, "");
  for (const char *part = s;;) {
    const char *end = strstr(part, "<channel|>");
    const size_t n = end ? (size_t)(end - part) : strlen(part);
    const char *open = memmem(part, n, "<|channel>", 10);
    chat_put_n(&t, part, open ? (size_t)(open - part) : n);
    if (!end) break;
    part = end + 10;
  }
  if (t.oom) b->oom = true;
  else gm_put_trimmed(b, t.p, t.len);
  mole_free(t.p);
}

mole_status chat_gemma_render(chat_buf *b, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt) {
  const bool think = opt && opt->thinking == CHAT_THINK_ON;
  const bool first_sys = n > 0 && (!strcmp(t[0].role, "system") || !strcmp(t[0].role, "developer"));
  if (think || first_sys) {
    chat_put(b, "<|turn>system\n");
    if (think) chat_put(b, "<|think|>\n");
    if (first_sys && t[0].content) gm_put_trimmed(b, t[0].content, strlen(t[0].content));
    chat_put(b, "<turn|>\n");
  }
  const char *prev = NULL;
  for (int64_t i = first_sys ? 1 : 0; i < n; i++) {
    const bool model = !strcmp(t[i].role, "assistant");
    if (!(model && prev && !strcmp(prev, "assistant"))) {
      chat_put(b, "<|turn>");
      chat_put(b, model ? "model" : t[i].role);
      chat_put(b, "\n");
    }
    const char *c = t[i].content ? t[i].content : "";
    if (model) gm_put_answer(b, c);
    else gm_put_trimmed(b, c, strlen(c));
    chat_put(b, "<turn|>\n");
    prev = t[i].role;
  }
  if (add_ass) {
    chat_put(b, "<|turn>model\n");
    if (!think) chat_put(b, "<|channel>thought\n<channel|>");
  }
  return MOLE_OK;
}
