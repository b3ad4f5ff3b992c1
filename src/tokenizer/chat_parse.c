// tokenizer/chat_parse: the model's generated text split into content,
// reasoning and tool calls, incrementally (see chat_parser in chat.h).
//
// gpt-oss (harmony): after the prompt's "<|start|>assistant" the model writes
// messages: a header up to <|message|> ("<|channel|>analysis",
// "<|channel|>commentary to=functions.NAME <|constrain|>json", or after a
// <|start|> "assistant<|channel|>final", the recipient also before the
// channel), then the body up to <|end|> (then <|start|> and the next header),
// <|return|> or <|call|> (end-of-generation tokens: the output stops there).
// Bodies go to reasoning (analysis), content (final, and commentary for
// nobody: a preamble) or a tool call (commentary to a recipient).
//
// Thinking models (DeepSeek-R1, GLM-4.5+, Qwen3): "<think>reasoning</think>answer";
// Gemma 4: "<|channel>thought\nreasoning<channel|>answer".
// The output may open with <think> (after whitespace), or start inside the
// thinking when the prompt ended with <think> (chat_parser_in_thinking).
// As llama.cpp does, the reasoning is trimmed and the answer after
// </think> loses its leading whitespace; output without <think> is content as
// it is.
#include <string.h>

#include "tokenizer/chat_internal.h"

enum { HEAD_MAX = 256, RUN_MAX = 256, WS_MAX = 64 };

typedef enum { MODE_PASS, MODE_HARMONY, MODE_THINK } parse_mode;

// harmony: in a header, a body, after a message's end; thinking: before
// anything but whitespace, in the reasoning, in the answer
typedef enum { ST_HEADER, ST_BODY, ST_AFTER, ST_OPEN, ST_THINK, ST_ANSWER } parse_state;

typedef enum {
  MK_START,
  MK_CHANNEL,
  MK_MESSAGE,
  MK_END,
  MK_CONSTRAIN,
  MK_RETURN,
  MK_CALL,
  MK_THINK,
  MK_THINK_END,
  MK_THOUGHT,
  MK_THOUGHT_END,
  MK_COUNT,
} marker;

static const char *const k_markers[MK_COUNT] = {
    "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|return|>", "<|call|>",
    "<think>",   "</think>",   "<|channel>thought", "<channel|>",
};
enum { MARKER_MAX = 17 };  // the longest, <|channel>thought

struct chat_parser {
  parse_mode mode;
  marker mk_first, mk_end;  // the mode's markers: [mk_first, mk_end); thinking: open, close
  parse_state st;
  bool started;             // thinking: a non-space byte of this part came already
  char ws[WS_MAX];          // thinking: whitespace held (trimmed if the reasoning ends here)
  size_t n_ws;
  chat_part body;           // the part the current body goes to
  char hold[MARKER_MAX];    // the start of what may be a marker
  size_t n_hold;
  char head[HEAD_MAX + 1];  // the header so far, markers included, as written
  size_t n_head;
};

static parse_mode mode_of(chat_tmpl t) {
  switch (t) {
    case CHAT_TMPL_GPT_OSS: return MODE_HARMONY;
    case CHAT_TMPL_CHATML:     // Qwen3, QwQ
    case CHAT_TMPL_DEEPSEEK3:  // DeepSeek-R1
    case CHAT_TMPL_GLM45:
    case CHAT_TMPL_GLM47:
    case CHAT_TMPL_QWEN3:
    case CHAT_TMPL_QWEN35:
    case CHAT_TMPL_GEMMA4:
      return MODE_THINK;
    default: return MODE_PASS;
  }
}

bool chat_template_has_reasoning(chat_tmpl t) { return mode_of(t) != MODE_PASS; }

mole_status chat_parser_new(chat_tmpl t, chat_parser **out) {
  *out = NULL;
  chat_parser *p = mole_calloc(1, sizeof *p);
  if (!p) return mole_errorf(MOLE_ERR_NOMEM, "chat: out of memory");
  p->mode = mode_of(t);
  p->mk_first = t == CHAT_TMPL_GEMMA4 ? MK_THOUGHT : p->mode == MODE_THINK ? MK_THINK : MK_START;
  p->mk_end = p->mode == MODE_THINK ? (marker)(p->mk_first + 2) : MK_THINK;
  p->st = p->mode == MODE_THINK ? ST_OPEN : ST_HEADER;
  p->body = CHAT_PART_CONTENT;
  *out = p;
  return MOLE_OK;
}

void chat_parser_in_thinking(chat_parser *p) {
  if (p->mode == MODE_THINK && p->st == ST_OPEN && p->n_ws == 0 && p->n_hold == 0) p->st = ST_THINK;
}

void chat_parser_free(chat_parser *p) { mole_free(p); }

// Output of one feed, batched by part.
typedef struct {
  chat_emit_fn emit;
  void *ud;
  chat_part part;
  char buf[RUN_MAX];
  size_t n;
} run;

static void run_flush(run *r) {
  if (r->n) r->emit(r->ud, r->part, r->buf, r->n);
  r->n = 0;
}

static void run_put(run *r, chat_part part, const char *s, size_t n) {
  if (part != r->part) run_flush(r), r->part = part;
  for (size_t i = 0; i < n; i++) {
    if (r->n == RUN_MAX) run_flush(r);
    r->buf[r->n++] = s[i];
  }
}

static void run_emit_whole(run *r, chat_part part, const char *s, size_t n) {  // one emit for the whole text
  run_flush(r);
  r->emit(r->ud, part, s, n);
}

// A header that is not one: its text, as written, is content, and so is what follows.
static void head_fail(chat_parser *p, run *r, const char *tail) {
  run_put(r, CHAT_PART_CONTENT, p->head, p->n_head);
  run_put(r, CHAT_PART_CONTENT, tail, strlen(tail));
  p->n_head = 0;
  p->head[0] = 0;
  p->st = ST_BODY;
  p->body = CHAT_PART_CONTENT;
}

static void head_clear(chat_parser *p) {
  p->n_head = 0;
  p->head[0] = 0;
}

static bool head_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-' || c == '=' || c == ':' || c == '/' || c == ' ';
}

static void head_add(chat_parser *p, run *r, const char *s, size_t n) {
  if (p->n_head + n > HEAD_MAX) {
    char t[MARKER_MAX + 1];
    memcpy(t, s, n);  // n <= MARKER_MAX
    t[n] = 0;
    head_fail(p, r, t);
    return;
  }
  memcpy(p->head + p->n_head, s, n);
  p->n_head += n;
  p->head[p->n_head] = 0;
}

// The word of the header at s (up to a space, a marker or the end).
static size_t head_word(const char *s) {
  size_t n = 0;
  while (s[n] && s[n] != ' ' && s[n] != '<') n++;
  return n;
}

// <|message|> closes the header: where its body goes.
static void head_done(chat_parser *p, run *r) {
  const char *h = p->head, *ch = strstr(h, "<|channel|>");
  const char *to = strstr(h, "to=");
  if (!ch) {
    head_fail(p, r, "<|message|>");
    return;
  }
  for (const char *q = h; q < ch && q != to; q++)  // before the channel: a role, then maybe the recipient
    if (!((*q >= 'a' && *q <= 'z') || *q == ' ')) {
      head_fail(p, r, "<|message|>");
      return;
    }
  const char *name = ch + strlen("<|channel|>");
  const size_t nl = head_word(name);
  chat_part part;
  if (nl == 8 && !memcmp(name, "analysis", 8)) {
    part = CHAT_PART_REASONING;
  } else if (nl == 5 && !memcmp(name, "final", 5)) {
    part = CHAT_PART_CONTENT;
  } else if (nl == 10 && !memcmp(name, "commentary", 10)) {
    part = to ? CHAT_PART_TOOL_ARGS : CHAT_PART_CONTENT;
  } else {
    head_fail(p, r, "<|message|>");
    return;
  }
  if (part == CHAT_PART_TOOL_ARGS) {
    const char *fn = to + 3;
    size_t fl = head_word(fn);
    if (fl > 10 && !memcmp(fn, "functions.", 10)) fn += 10, fl -= 10;
    run_emit_whole(r, CHAT_PART_TOOL_NAME, fn, fl);
  }
  head_clear(p);
  p->st = ST_BODY;
  p->body = part;
}

// ---- thinking ----

static void ws_flush(chat_parser *p, run *r, chat_part part) {
  run_put(r, part, p->ws, p->n_ws);
  p->n_ws = 0;
}

static void think_text(chat_parser *p, run *r, char c) {
  const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
  switch (p->st) {
    case ST_OPEN:  // whitespace is held until <think> drops it or text keeps it
      if (space && p->n_ws < WS_MAX) {
        p->ws[p->n_ws++] = c;
        return;
      }
      ws_flush(p, r, CHAT_PART_CONTENT);
      p->st = ST_ANSWER;
      p->started = true;
      run_put(r, CHAT_PART_CONTENT, &c, 1);
      return;
    case ST_THINK:  // leading whitespace dropped, trailing held until more text
      if (!p->started && space) return;
      p->started = true;
      if (space) {
        if (p->n_ws == WS_MAX) ws_flush(p, r, CHAT_PART_REASONING);
        p->ws[p->n_ws++] = c;
        return;
      }
      ws_flush(p, r, CHAT_PART_REASONING);
      run_put(r, CHAT_PART_REASONING, &c, 1);
      return;
    default:  // the answer, its leading whitespace dropped
      if (!p->started && space) return;
      p->started = true;
      run_put(r, CHAT_PART_CONTENT, &c, 1);
      return;
  }
}

static void think_marker(chat_parser *p, run *r, marker m) {
  if (p->st == ST_OPEN && m == p->mk_first) {
    p->n_ws = 0;
    p->st = ST_THINK;
    p->started = false;
  } else if (p->st == ST_THINK && m == p->mk_first + 1) {
    p->n_ws = 0;
    p->st = ST_ANSWER;
    p->started = false;
  } else {  // out of place: text
    for (const char *t = k_markers[m]; *t; t++) think_text(p, r, *t);
  }
}

// ---- harmony ----

static void on_marker(chat_parser *p, run *r, marker m) {
  if (p->mode == MODE_THINK) {
    think_marker(p, r, m);
    return;
  }
  const char *text = k_markers[m];
  switch (p->st) {
    case ST_HEADER:
      if (m == MK_MESSAGE) {
        head_done(p, r);
      } else if (m == MK_CHANNEL || m == MK_CONSTRAIN) {
        head_add(p, r, text, strlen(text));
      } else if (m == MK_START) {  // a header again: what came before was none
        if (p->n_head) run_put(r, CHAT_PART_CONTENT, p->head, p->n_head);
        head_clear(p);
      } else {
        head_fail(p, r, text);
        p->st = ST_AFTER;
      }
      break;
    case ST_BODY:
    case ST_AFTER:
      if (m == MK_START || m == MK_CHANNEL) {
        p->st = ST_HEADER;
        head_clear(p);
        if (m == MK_CHANNEL) head_add(p, r, text, strlen(text));
      } else if (p->st == ST_BODY && (m == MK_END || m == MK_RETURN || m == MK_CALL)) {
        p->st = ST_AFTER;
      } else {  // <|message|> or <|constrain|> in a body, anything out of place after one: text
        run_put(r, p->st == ST_BODY ? p->body : CHAT_PART_CONTENT, text, strlen(text));
      }
      break;
    default:
      MOLE_ASSERT(!"harmony: a thinking state");
  }
}

static void on_text(chat_parser *p, run *r, char c) {
  if (p->mode == MODE_THINK) {
    think_text(p, r, c);
    return;
  }
  switch (p->st) {
    case ST_HEADER:
      if (head_char_ok(c)) head_add(p, r, &c, 1);
      else head_fail(p, r, (char[2]){c, 0});
      break;
    case ST_AFTER:  // text where a <|start|> belongs: content
      p->st = ST_BODY;
      p->body = CHAT_PART_CONTENT;
      run_put(r, CHAT_PART_CONTENT, &c, 1);
      break;
    case ST_BODY:
      run_put(r, p->body, &c, 1);
      break;
    default:
      MOLE_ASSERT(!"harmony: a thinking state");
  }
}

// One byte through the marker matcher.
static void step(chat_parser *p, run *r, char c) {
  if (p->n_hold == 0 && c != '<') {
    on_text(p, r, c);
    return;
  }
  p->hold[p->n_hold++] = c;
  bool prefix = false;
  for (int m = (int)p->mk_first; m < (int)p->mk_end; m++) {
    const size_t ml = strlen(k_markers[m]);
    if (p->n_hold > ml || memcmp(k_markers[m], p->hold, p->n_hold)) continue;
    if (p->n_hold == ml) {
      p->n_hold = 0;
      on_marker(p, r, (marker)m);
      return;
    }
    prefix = true;
  }
  if (prefix) return;
  // not a marker: its first byte is text, the rest may start one
  char rest[MARKER_MAX];
  const size_t nr = p->n_hold - 1;
  memcpy(rest, p->hold + 1, nr);
  p->n_hold = 0;
  on_text(p, r, p->hold[0]);
  for (size_t i = 0; i < nr; i++) step(p, r, rest[i]);
}

void chat_parser_feed(chat_parser *p, const char *text, size_t n, chat_emit_fn emit, void *ud) {
  if (p->mode == MODE_PASS) {
    if (n) emit(ud, CHAT_PART_CONTENT, text, n);
    return;
  }
  run r = {.emit = emit, .ud = ud, .part = CHAT_PART_CONTENT};
  for (size_t i = 0; i < n; i++) step(p, &r, text[i]);
  run_flush(&r);
}

void chat_parser_finish(chat_parser *p, chat_emit_fn emit, void *ud) {
  if (p->mode == MODE_PASS) return;
  run r = {.emit = emit, .ud = ud, .part = CHAT_PART_CONTENT};
  char held[MARKER_MAX];
  const size_t nh = p->n_hold;
  memcpy(held, p->hold, nh);
  p->n_hold = 0;
  for (size_t i = 0; i < nh; i++) on_text(p, &r, held[i]);  // no marker can complete now
  if (p->st == ST_HEADER && p->n_head) run_put(&r, CHAT_PART_CONTENT, p->head, p->n_head);
  head_clear(p);
  if (p->st == ST_OPEN) ws_flush(p, &r, CHAT_PART_CONTENT);  // whitespace only: as it is
  p->n_ws = 0;                                               // the reasoning's trailing whitespace: trimmed
  run_flush(&r);
}
