// srv_api: the JSON of the OpenAI API for mole serve. Requests are checked
// field by field (a wrong type or range is a 400 naming the field; unknown
// fields are ignored, as OpenAI does); sampling parameters use OpenAI's
// names plus llama-server's common extras (top_k, min_p, repeat_penalty),
// with llama.cpp's defaults where the request says nothing.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server/server_internal.h"

static bool bad(char *err, size_t cap, const char *fmt, ...) MOLE_PRINTF(3, 4);
static bool bad(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return false;
}

// optional number in [lo, hi]
static bool get_num(const cJSON *o, const char *k, double lo, double hi, double *v, char *err, size_t cap) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!x || cJSON_IsNull(x)) return true;
  if (!cJSON_IsNumber(x)) return bad(err, cap, "'%s' must be a number", k);
  if (!(x->valuedouble >= lo && x->valuedouble <= hi)) return bad(err, cap, "'%s' must be in [%g, %g]", k, lo, hi);
  *v = x->valuedouble;
  return true;
}

// optional integer in [lo, hi]
static bool get_int(const cJSON *o, const char *k, double lo, double hi, int64_t *v, char *err, size_t cap) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!x || cJSON_IsNull(x)) return true;
  if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble)) return bad(err, cap, "'%s' must be an integer", k);
  if (!(x->valuedouble >= lo && x->valuedouble <= hi)) return bad(err, cap, "'%s' must be in [%.0f, %.0f]", k, lo, hi);
  *v = (int64_t)x->valuedouble;
  return true;
}

static bool get_bool(const cJSON *o, const char *k, bool *v, char *err, size_t cap) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!x || cJSON_IsNull(x)) return true;
  if (!cJSON_IsBool(x)) return bad(err, cap, "'%s' must be true or false", k);
  *v = cJSON_IsTrue(x);
  return true;
}

// Text of a message's content: a string, or an array of {"type": "text", "text": ...} parts.
static char *content_text(const cJSON *c, int64_t i, char *err, size_t cap) {
  if (cJSON_IsString(c)) return mole_strdup(c->valuestring);
  if (!cJSON_IsArray(c)) {
    bad(err, cap, "'messages[%lld].content' must be a string or an array of text parts", (long long)i);
    return NULL;
  }
  size_t n = 1;
  const cJSON *p;
  cJSON_ArrayForEach(p, c) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text"), *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(t)) {
      bad(err, cap, "'messages[%lld].content' parts must be {\"type\": \"text\", \"text\": string} (only text is supported)",
          (long long)i);
      return NULL;
    }
    n += strlen(t->valuestring);
  }
  char *s = mole_malloc(n);
  if (!s) return NULL;
  s[0] = 0;
  cJSON_ArrayForEach(p, c) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
  return s;
}

// An assistant message's first tool call: its function's name and arguments (a JSON string, as the API sends it).
static bool parse_tool_call(const cJSON *m, int64_t i, chat_turn *t, char *err, size_t cap) {
  const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
  if (!calls || cJSON_IsNull(calls) || (cJSON_IsArray(calls) && !calls->child)) return true;
  const cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "function");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
  if (!cJSON_IsArray(calls) || !cJSON_IsString(name) || (args && !cJSON_IsString(args) && !cJSON_IsObject(args)))
    return bad(err, cap, "'messages[%lld].tool_calls' must be [{\"function\": {\"name\": string, \"arguments\": string}}]",
               (long long)i);
  t->tool_name = name->valuestring;
  if (cJSON_IsString(args)) {
    t->tool_args = mole_strdup(args->valuestring);
  } else if (args) {  // an object, as some clients send it
    char *a = cJSON_PrintUnformatted(args);
    t->tool_args = a ? mole_strdup(a) : NULL;
    cJSON_free(a);
  }
  if (args && !t->tool_args) return bad(err, cap, "out of memory");
  return true;
}

// The template's options from the request: reasoning_effort (OpenAI's field,
// or llama-server's chat_template_kwargs), enable_thinking (chat_template_kwargs)
// and tools.
static bool parse_chat_options(const cJSON *root, chat_options *o, char **tools, char *err, size_t cap) {
  const cJSON *eff = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
  const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
  if (!eff && cJSON_IsObject(kw)) eff = cJSON_GetObjectItemCaseSensitive(kw, "reasoning_effort");
  if (eff && !cJSON_IsNull(eff)) {
    if (!cJSON_IsString(eff)) return bad(err, cap, "'reasoning_effort' must be a string");
    o->reasoning_effort = eff->valuestring;
  }
  if (cJSON_IsObject(kw) && cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking")) {
    bool think = true;
    if (!get_bool(kw, "enable_thinking", &think, err, cap)) return false;
    o->thinking = think ? CHAT_THINK_ON : CHAT_THINK_OFF;
  }
  const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "tools");
  if (tl && !cJSON_IsNull(tl)) {
    if (!cJSON_IsArray(tl)) return bad(err, cap, "'tools' must be an array");
    if (!(*tools = cJSON_PrintUnformatted(tl))) return bad(err, cap, "out of memory");
    o->tools = *tools;
  }
  return true;
}

static bool parse_messages(const srv_api_ctx *c, const cJSON *root, char **text, char *err, size_t cap) {
  const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
  if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0) return bad(err, cap, "'messages' must be a non-empty array");
  const int64_t n = cJSON_GetArraySize(ms);
  if (n > 4096) return bad(err, cap, "'messages' has %lld entries (at most 4096)", (long long)n);
  chat_turn *t = mole_calloc((size_t)n, sizeof *t);
  if (!t) return bad(err, cap, "out of memory");
  const bool full = c->tmpl == CHAT_TMPL_GPT_OSS;  // the family that renders developer and tool turns
  const bool reasoning = chat_template_has_reasoning(c->tmpl);
  bool ok = true;
  int64_t i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, ms) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *ct = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
      ok = bad(err, cap, "'messages[%lld]' must be an object with a string 'role'", (long long)i);
      break;
    }
    const char *r = role->valuestring;
    if (!full && !strcmp(r, "developer")) r = "system";  // OpenAI's newer name for it
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") &&
        (!full || strcmp(r, "tool"))) {
      ok = bad(err, cap, "'messages[%lld].role' is '%.40s': expected system, developer, user%s or assistant", (long long)i,
               role->valuestring, full ? ", tool" : "");
      break;
    }
    t[i].role = r;
    if (reasoning && !strcmp(r, "assistant")) {
      const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
      if (!rc) rc = cJSON_GetObjectItemCaseSensitive(m, "thinking");
      if (rc && !cJSON_IsNull(rc) && !cJSON_IsString(rc)) {
        ok = bad(err, cap, "'messages[%lld].reasoning_content' must be a string", (long long)i);
        break;
      }
      if (cJSON_IsString(rc)) t[i].reasoning = rc->valuestring;
      if (full && !(ok = parse_tool_call(m, i, &t[i], err, cap))) break;
    }
    const bool may_lack = t[i].tool_name != NULL;  // an assistant turn that only calls a tool
    if ((!ct || cJSON_IsNull(ct)) && may_lack) {
      i++;
      continue;
    }
    if (!ct || !(t[i].content = content_text(ct, i, err, cap))) {
      if (!ct) bad(err, cap, "'messages[%lld]' has no 'content'", (long long)i);
      ok = false;
      break;
    }
    i++;
  }
  chat_options opt = {0};
  char *tools = NULL;
  if (ok) ok = parse_chat_options(root, &opt, &tools, err, cap);
  if (ok) {
    mole_status st = chat_format_turns(c->tmpl, t, n, true, &opt, text);
    if (st) ok = bad(err, cap, "%s", mole_last_error());
  }
  for (int64_t j = 0; j < n; j++) {
    mole_free((void *)t[j].content);
    mole_free((void *)t[j].tool_args);
  }
  cJSON_free(tools);
  mole_free(t);
  return ok;
}

static bool parse_prompt(const srv_api_ctx *c, const cJSON *root, srv_req *r, char **text, char *err, size_t cap) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
  if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
    p = cJSON_GetArrayItem(p, 0);  // a batch of one prompt
  if (cJSON_IsString(p)) {
    *text = mole_strdup(p->valuestring);
    return *text != NULL;
  }
  if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(p, 0))) {  // token ids
    const int64_t n = cJSON_GetArraySize(p), V = tok_n_vocab(c->voc);
    if (n > c->max_prompt) return bad(err, cap, "'prompt' has %lld tokens (at most %lld)", (long long)n, (long long)c->max_prompt);
    r->prompt = mole_malloc((size_t)n * sizeof *r->prompt);
    if (!r->prompt) return bad(err, cap, "out of memory");
    int64_t i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
      if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= (double)V)
        return bad(err, cap, "'prompt[%lld]' must be a token id in [0, %lld)", (long long)i, (long long)V);
      r->prompt[i++] = (int32_t)t->valuedouble;
    }
    r->n_prompt = n;
    return true;
  }
  if (cJSON_IsArray(p)) return bad(err, cap, "'prompt' must be a string, an array of one string, or an array of token ids");
  return bad(err, cap, "'prompt' must be a string or an array of token ids");
}

static bool parse_stops(const cJSON *root, srv_req *r, char *err, size_t cap) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
  if (!s || cJSON_IsNull(s)) return true;
  const cJSON *one[1] = {s};
  int64_t n = cJSON_IsString(s) ? 1 : cJSON_IsArray(s) ? cJSON_GetArraySize(s) : -1;
  if (n < 0) return bad(err, cap, "'stop' must be a string or an array of strings");
  if (n > SRV_MAX_STOPS) return bad(err, cap, "'stop' has %lld strings (at most %d)", (long long)n, SRV_MAX_STOPS);
  for (int64_t i = 0; i < n; i++) {
    const cJSON *x = cJSON_IsString(s) ? one[0] : cJSON_GetArrayItem(s, (int)i);
    if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) > 1024)
      return bad(err, cap, "'stop' strings must be non-empty and at most 1024 bytes");
    if (!(r->stops[r->n_stops] = mole_strdup(x->valuestring))) return bad(err, cap, "out of memory");
    r->n_stops++;
  }
  return true;
}

srv_req *srv_api_parse(const srv_api_ctx *c, bool chat, const char *body, size_t n, char *err, size_t cap) {
  cJSON *root = cJSON_ParseWithLength(body, n);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    snprintf(err, cap, "the body is not a JSON object");
    return NULL;
  }
  srv_req *r = srv_req_new();
  char *text = NULL;
  bool ok = r != NULL || bad(err, cap, "out of memory");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (ok && model && !cJSON_IsString(model) && !cJSON_IsNull(model)) ok = bad(err, cap, "'model' must be a string");
  sampler_params sp = sampler_params_default();
  double temp = sp.temperature, top_p = sp.top_p, min_p = sp.min_p, rp = sp.repeat_penalty, pp = 0, fp = 0;
  int64_t top_k = sp.top_k, seed = -1, n_choices = 1, max_tokens = c->max_tokens, top_lp = -1, lp_legacy = -1;
  bool stream = false, logprobs = false, echo = false;
  ok = ok && get_num(root, "temperature", 0, 100, &temp, err, cap) && get_num(root, "top_p", 0, 1, &top_p, err, cap) &&
       get_num(root, "min_p", 0, 1, &min_p, err, cap) && get_num(root, "repeat_penalty", 1e-3, 100, &rp, err, cap) &&
       get_num(root, "presence_penalty", -2, 2, &pp, err, cap) &&
       get_num(root, "frequency_penalty", -2, 2, &fp, err, cap) && get_int(root, "top_k", 0, 1e9, &top_k, err, cap) &&
       get_int(root, "seed", -9.2e18, 9.2e18, &seed, err, cap) && get_int(root, "n", 1, 1e9, &n_choices, err, cap) &&
       get_int(root, "max_tokens", 1, 1 << 24, &max_tokens, err, cap) &&
       get_int(root, "max_completion_tokens", 1, 1 << 24, &max_tokens, err, cap) &&
       get_bool(root, "stream", &stream, err, cap) && parse_stops(root, r, err, cap);
  if (ok && n_choices != 1) ok = bad(err, cap, "'n' must be 1: one choice per request");
  if (ok && chat) {
    ok = get_bool(root, "logprobs", &logprobs, err, cap) &&
         get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top_lp, err, cap);
    if (ok && top_lp >= 0 && !logprobs) ok = bad(err, cap, "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = logprobs ? (int32_t)MOLE_MAX(top_lp, 0) : -1;
  } else if (ok) {
    ok = get_int(root, "logprobs", 0, 5, &lp_legacy, err, cap) && get_bool(root, "echo", &echo, err, cap);
    if (ok && echo) ok = bad(err, cap, "'echo' is not supported");
    r->top_logprobs = (int32_t)lp_legacy;
  }
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
  if (ok && so && !cJSON_IsNull(so)) {
    bool inc = false;
    if (!cJSON_IsObject(so)) ok = bad(err, cap, "'stream_options' must be an object");
    else ok = get_bool(so, "include_usage", &inc, err, cap);
    r->include_usage = inc;
  }
  if (ok) ok = chat ? parse_messages(c, root, &text, err, cap) : parse_prompt(c, root, r, &text, err, cap);
  bool thinking = false;  // the prompt ends inside <think>
  if (ok && text) {
    const size_t tl = strlen(text);
    thinking = (tl >= 7 && !strcmp(text + tl - 7, "<think>")) || (tl >= 8 && !strcmp(text + tl - 8, "<think>\n"));
    int32_t *ids;
    int64_t ni;
    mole_status st = tok_encode(c->voc, text, strlen(text), true, true, &ids, &ni);
    if (st) ok = bad(err, cap, "tokenizing the prompt: %s", mole_last_error());
    else r->prompt = ids, r->n_prompt = ni;
  }
  if (ok && r->n_prompt == 0) ok = bad(err, cap, "the prompt is empty");
  if (ok && r->n_prompt > c->max_prompt)
    ok = bad(err, cap, "the prompt has %lld tokens; this server takes at most %lld", (long long)r->n_prompt,
             (long long)c->max_prompt);
  mole_free(text);
  cJSON_Delete(root);
  if (!ok) {
    srv_req_release(r);
    return NULL;
  }
  sp.temperature = (float)temp;
  sp.top_p = (float)top_p;
  sp.min_p = (float)min_p;
  sp.repeat_penalty = (float)rp;
  sp.presence_penalty = (float)pp;
  sp.frequency_penalty = (float)fp;
  sp.top_k = (int32_t)MOLE_MIN(top_k, (int64_t)INT32_MAX);
  if (seed >= 0) sp.seed = (uint64_t)seed;
  r->sp = sp;
  r->chat = chat;
  r->split = chat && chat_template_has_reasoning(c->tmpl) ? c->tmpl : CHAT_TMPL_UNKNOWN;
  r->split_thinking = r->split != CHAT_TMPL_UNKNOWN && thinking;
  r->stream = stream;
  r->max_tokens = MOLE_MIN(max_tokens, c->max_tokens);
  r->created = (int64_t)time(NULL);
  static atomic_ullong counter;
  snprintf(r->id, sizeof r->id, "%s-%llx%llx", chat ? "chatcmpl" : "cmpl",
           (unsigned long long)mole_time_us(), (unsigned long long)atomic_fetch_add(&counter, 1));
  return r;
}

// ---- responses ------------------------------------------------------------------------

// A token's text as valid UTF-8 (U+FFFD for a piece of a character) and its bytes.
static void add_token_text(const srv_api_ctx *c, cJSON *o, const char *key, int32_t tok, bool with_bytes) {
  char piece[256];
  int64_t n = tok_piece(c->voc, tok, piece, sizeof piece - 1, false);
  n = n < 0 ? 0 : MOLE_MIN(n, (int64_t)sizeof piece - 1);
  char out[768];
  size_t m = 0;
  for (int64_t i = 0; i < n;) {
    const unsigned char b = (unsigned char)piece[i];
    const int len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    bool okc = len > 0 && i + len <= n;
    for (int k = 1; okc && k < len; k++) okc = ((unsigned char)piece[i + k] & 0xC0) == 0x80;
    if (okc) {
      memcpy(out + m, piece + i, (size_t)len);
      m += (size_t)len;
      i += len;
    } else {
      memcpy(out + m, "\xEF\xBF\xBD", 3);
      m += 3;
      i++;
    }
  }
  out[m] = 0;
  cJSON_AddStringToObject(o, key, out);
  if (with_bytes) {
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)piece[i]));
  }
}

static cJSON *chat_logprobs(const srv_api_ctx *c, const srv_req *r, int64_t from, int64_t to) {
  cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
  for (int64_t i = from; i < to; i++) {
    const srv_logprob *lp = &r->lp[i];
    cJSON *e = cJSON_CreateObject();
    add_token_text(c, e, "token", lp->token, true);
    cJSON_AddNumberToObject(e, "logprob", lp->logprob);
    cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int32_t k = 0; k < lp->n_top; k++) {
      cJSON *t = cJSON_CreateObject();
      add_token_text(c, t, "token", lp->top_tok[k], true);
      cJSON_AddNumberToObject(t, "logprob", lp->top_lp[k]);
      cJSON_AddItemToArray(tops, t);
    }
    cJSON_AddItemToArray(content, e);
  }
  return o;
}

static cJSON *completion_logprobs(const srv_api_ctx *c, const srv_req *r, int64_t from, int64_t to) {
  cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens"),
        *lps = cJSON_AddArrayToObject(o, "token_logprobs"), *tops = cJSON_AddArrayToObject(o, "top_logprobs");
  for (int64_t i = from; i < to; i++) {
    const srv_logprob *lp = &r->lp[i];
    cJSON *t = cJSON_CreateObject();
    add_token_text(c, t, "t", lp->token, false);
    cJSON_AddItemToArray(toks, cJSON_DetachItemFromObject(t, "t"));
    cJSON_Delete(t);
    cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp->logprob));
    cJSON *m = cJSON_CreateObject();
    for (int32_t k = 0; k < lp->n_top; k++) {
      cJSON *x = cJSON_CreateObject();
      add_token_text(c, x, "t", lp->top_tok[k], false);
      const char *key = cJSON_GetObjectItem(x, "t")->valuestring;
      if (!cJSON_GetObjectItemCaseSensitive(m, key)) cJSON_AddNumberToObject(m, key, lp->top_lp[k]);
      cJSON_Delete(x);
    }
    cJSON_AddItemToArray(tops, m);
  }
  return o;
}

static void add_usage(cJSON *o, const srv_req *r) {
  cJSON *u = cJSON_AddObjectToObject(o, "usage");
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)r->n_gen);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(r->n_prompt + r->n_gen));
  cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", (double)r->n_cached);
}

static cJSON *head(const srv_api_ctx *c, const srv_req *r, const char *object) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", object);
  cJSON_AddNumberToObject(o, "created", (double)r->created);
  cJSON_AddStringToObject(o, "model", c->model_id);
  return o;
}

static char *print(cJSON *o) {
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return NULL;
  char *d = mole_strdup(s);
  cJSON_free(s);
  return d;
}

// {"index": 0, "id", "type": "function", "function": {"name", "arguments"}}: with_head adds the
// id, type and name (a stream's first tool chunk); args NULL leaves the arguments out.
static cJSON *tool_call(const srv_req *r, bool with_head, const char *args) {
  cJSON *tc = cJSON_CreateObject(), *fn;
  cJSON_AddNumberToObject(tc, "index", 0);
  if (with_head) {
    char id[64];
    snprintf(id, sizeof id, "call_%s", r->id);
    cJSON_AddStringToObject(tc, "id", id);
    cJSON_AddStringToObject(tc, "type", "function");
  }
  fn = cJSON_AddObjectToObject(tc, "function");
  if (with_head) cJSON_AddStringToObject(fn, "name", r->tool_name);
  if (args) cJSON_AddStringToObject(fn, "arguments", args);
  return tc;
}

char *srv_api_response(const srv_api_ctx *c, const srv_req *r) {
  cJSON *o = head(c, r, r->chat ? "chat.completion" : "text_completion");
  cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddNumberToObject(ch, "index", 0);
  const char *text = r->text ? r->text : "";
  if (r->chat) {
    cJSON *m = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", text);
    if (r->n_reasoning) cJSON_AddStringToObject(m, "reasoning_content", r->reasoning);
    if (r->tool_name[0])
      cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "tool_calls"), tool_call(r, true, r->n_tool_args ? r->tool_args : ""));
  } else {
    cJSON_AddStringToObject(ch, "text", text);
  }
  if (r->top_logprobs >= 0)
    cJSON_AddItemToObject(ch, "logprobs", r->chat ? chat_logprobs(c, r, 0, r->n_lp) : completion_logprobs(c, r, 0, r->n_lp));
  else
    cJSON_AddNullToObject(ch, "logprobs");
  cJSON_AddStringToObject(ch, "finish_reason", r->finish ? r->finish : "stop");
  cJSON_AddItemToArray(choices, ch);
  add_usage(o, r);
  return print(o);
}

static char *sse(cJSON *o) {
  char *j = print(o);
  if (!j) return NULL;
  const size_t n = strlen(j) + 9;
  char *s = mole_malloc(n);
  if (s) snprintf(s, n, "data: %s\n\n", j);
  mole_free(j);
  return s;
}

// text[from, to) as a new string
static char *slice(const char *text, size_t from, size_t to) {
  char *p = mole_malloc(to - from + 1);
  if (!p) return NULL;
  if (to > from) memcpy(p, text + from, to - from);
  p[to - from] = 0;
  return p;
}

char *srv_api_chunk(const srv_api_ctx *c, const srv_req *r, const srv_span *sp, bool first, const char *finish) {
  const size_t from = sp->from, to = sp->to;
  const int64_t lp_from = sp->lp_from, lp_to = sp->lp_to;
  cJSON *o = head(c, r, r->chat ? "chat.completion.chunk" : "text_completion");
  cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddNumberToObject(ch, "index", 0);
  char *piece = slice(r->text, from, to);
  char *rpiece = sp->rto > sp->rfrom ? slice(r->reasoning, sp->rfrom, sp->rto) : NULL;
  char *tpiece = sp->tto > sp->tfrom ? slice(r->tool_args, sp->tfrom, sp->tto) : NULL;
  if (!piece || (sp->rto > sp->rfrom && !rpiece) || (sp->tto > sp->tfrom && !tpiece)) {
    mole_free(piece);
    mole_free(rpiece);
    mole_free(tpiece);
    cJSON_Delete(o);
    cJSON_Delete(ch);
    return NULL;
  }
  if (r->chat) {
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    if (first) cJSON_AddStringToObject(d, "role", "assistant");
    if (rpiece) cJSON_AddStringToObject(d, "reasoning_content", rpiece);
    if (to > from || (first && !rpiece)) cJSON_AddStringToObject(d, "content", piece);
    if (sp->tool_head || tpiece)
      cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"),
                           tool_call(r, sp->tool_head, tpiece ? tpiece : sp->tool_head ? "" : NULL));
  } else {
    cJSON_AddStringToObject(ch, "text", piece);
  }
  mole_free(piece);
  mole_free(rpiece);
  mole_free(tpiece);
  if (r->top_logprobs >= 0 && lp_to > lp_from)
    cJSON_AddItemToObject(ch, "logprobs",
                          r->chat ? chat_logprobs(c, r, lp_from, lp_to) : completion_logprobs(c, r, lp_from, lp_to));
  else
    cJSON_AddNullToObject(ch, "logprobs");
  if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
  else cJSON_AddNullToObject(ch, "finish_reason");
  cJSON_AddItemToArray(choices, ch);
  char *s = sse(o);
  if (finish && r->include_usage && s) {  // stream_options.include_usage: a last chunk with the usage and no choices
    cJSON *u = head(c, r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(u, "choices");
    add_usage(u, r);
    char *us = sse(u);
    if (us) {
      char *both = mole_malloc(strlen(s) + strlen(us) + 1);
      if (both) {
        strcpy(both, s);
        strcat(both, us);
        mole_free(s);
        s = both;
      }
      mole_free(us);
    }
  }
  return s;
}

char *srv_api_error(int status, const char *message) {
  const char *type = "invalid_request_error", *code = "invalid_request";
  switch (status) {
    case 401: type = "authentication_error", code = "invalid_api_key"; break;
    case 404: type = "invalid_request_error", code = "not_found"; break;
    case 405: code = "method_not_allowed"; break;
    case 408: code = "timeout"; break;
    case 413: code = "request_too_large"; break;
    case 429: type = "rate_limit_error", code = "rate_limit_exceeded"; break;
    case 500: type = "server_error", code = "internal_error"; break;
    case 503: type = "server_error", code = "server_busy"; break;
    default: break;
  }
  cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
  cJSON_AddStringToObject(e, "message", message);
  cJSON_AddStringToObject(e, "type", type);
  cJSON_AddStringToObject(e, "code", code);
  return print(o);
}
