// tokenizer/chat_harmony: gpt-oss's harmony prompt, byte for byte what the
// model's Jinja template (tests/data/chat/gpt-oss.jinja) renders with
// transformers' settings (trim_blocks, lstrip_blocks), quirks included: a
// nested object's properties start on a new line indented by 16 spaces, and a
// oneOf variant's default by 20, as the template's whitespace leaves them.
// Also Jinja's tojson (chat_put_json), which the template applies to tool
// arguments, results and parameter defaults.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/chat_internal.h"

// ---- tojson ---------------------------------------------------------------------------

void chat_put_json_str(chat_buf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  chat_put(b, "\"");
  size_t run = 0;  // bytes copied as they are, written in one go
  for (size_t i = 0; i < n; i++) {
    const unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char u[7];
    switch (c) {
      case '"': esc = "\\\""; break;
      case '\\': esc = "\\\\"; break;
      case '\b': esc = "\\b"; break;
      case '\f': esc = "\\f"; break;
      case '\n': esc = "\\n"; break;
      case '\r': esc = "\\r"; break;
      case '\t': esc = "\\t"; break;
      default:
        if (c < 0x20) {
          memcpy(u, "\\u00", 4);
          u[4] = hex[c >> 4];
          u[5] = hex[c & 15];
          u[6] = 0;
          esc = u;
        }
    }
    if (!esc) {
      run++;
      continue;
    }
    chat_put_n(b, s + i - run, run);
    run = 0;
    chat_put(b, esc);
  }
  chat_put_n(b, s + n - run, run);
  chat_put(b, "\"");
}

// x as JavaScript's Number.prototype.toString (JSON.stringify) writes it: the
// shortest digits that read back as x, positional for decimal exponents in
// [-7, 21), else d.ddde+X.
static void chat_put_js_number(chat_buf *b, double x) {
  if (!isfinite(x)) {
    chat_put(b, "null");
    return;
  }
  if (x == 0) {
    chat_put(b, "0");
    return;
  }
  char e[40];
  int p = 1;
  for (; p < 17; p++) {
    snprintf(e, sizeof e, "%.*e", p - 1, x);
    if (strtod(e, NULL) == x) break;
  }
  snprintf(e, sizeof e, "%.*e", p - 1, x);
  // e: [-]d[.ddd]e[+-]XX
  char digits[24];
  int k = 0;
  const char *q = e;
  if (*q == '-') chat_put(b, "-"), q++;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[k++] = *q;
  while (k > 1 && digits[k - 1] == '0') k--;
  digits[k] = 0;
  const int n = atoi(q + 1) + 1;  // the decimal point after n digits
  char out[64];
  if (k <= n && n <= 21) {
    snprintf(out, sizeof out, "%s%0*d", digits, n - k, 0);
    if (n == k) out[k] = 0;
  } else if (0 < n && n <= 21) {
    snprintf(out, sizeof out, "%.*s.%s", n, digits, digits + n);
  } else if (-6 < n && n <= 0) {
    snprintf(out, sizeof out, "0.%0*d%s", -n, 0, digits);
    if (n == 0) snprintf(out, sizeof out, "0.%s", digits);
  } else {
    snprintf(out, sizeof out, "%c%s%se%c%d", digits[0], k > 1 ? "." : "", digits + 1, n - 1 >= 0 ? '+' : '-', abs(n - 1));
  }
  chat_put(b, out);
}

void chat_put_json(chat_buf *b, const cJSON *v) {
  if (cJSON_IsNull(v) || !v) {
    chat_put(b, "null");
  } else if (cJSON_IsTrue(v)) {
    chat_put(b, "true");
  } else if (cJSON_IsFalse(v)) {
    chat_put(b, "false");
  } else if (cJSON_IsNumber(v)) {
    chat_put_js_number(b, v->valuedouble);
  } else if (cJSON_IsString(v)) {
    chat_put_json_str(b, v->valuestring, strlen(v->valuestring));
  } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
    const bool obj = cJSON_IsObject(v);
    chat_put(b, obj ? "{" : "[");
    const cJSON *x;
    bool first = true;
    cJSON_ArrayForEach(x, v) {
      if (!first) chat_put(b, ", ");
      first = false;
      if (obj) {
        chat_put_json_str(b, x->string, strlen(x->string));
        chat_put(b, ": ");
      }
      chat_put_json(b, x);
    }
    chat_put(b, obj ? "}" : "]");
  } else if (cJSON_IsRaw(v)) {
    chat_put(b, v->valuestring);
  }
}

// ---- tools as TypeScript ------------------------------------------------------------------

static const cJSON *get(const cJSON *o, const char *k) {
  return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

// Jinja's truth: absent, null, false, 0, "", [] and {} are false.
static bool truthy(const cJSON *v) {
  if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return false;
  if (cJSON_IsNumber(v)) return v->valuedouble != 0;
  if (cJSON_IsString(v)) return v->valuestring[0] != 0;
  if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
  return true;
}

static bool is_type(const cJSON *spec, const char *type) {
  const cJSON *t = get(spec, "type");
  return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

// A value concatenated to a string (Jinja's + and join): strings as they are,
// anything else as its JSON.
static void put_str_value(chat_buf *b, const cJSON *v) {
  if (cJSON_IsString(v)) chat_put(b, v->valuestring);
  else chat_put_json(b, v);
}

static bool in_list(const cJSON *list, const char *s) {
  const cJSON *x;
  if (!cJSON_IsArray(list)) return false;
  cJSON_ArrayForEach(x, list) if (cJSON_IsString(x) && !strcmp(x->valuestring, s)) return true;
  return false;
}

static size_t utf8_chars(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
  return n;
}

// The template's render_typescript_type. (Its "any" for unions with object
// variants never happens: the flag is set inside a loop, where Jinja scopes it.)
static void ts_type(chat_buf *b, const cJSON *spec) {
  const cJSON *type = get(spec, "type"), *nullable = get(spec, "nullable");
  if (is_type(spec, "array")) {
    const cJSON *items = get(spec, "items");
    if (!truthy(items)) {
      chat_put(b, "any[]");
    } else if (is_type(items, "string")) {
      chat_put(b, "string[]");
    } else if (is_type(items, "number") || is_type(items, "integer")) {
      chat_put(b, "number[]");
    } else if (is_type(items, "boolean")) {
      chat_put(b, "boolean[]");
    } else {
      chat_buf in = {0};
      chat_put(&in, "");
      ts_type(&in, items);
      if (in.oom) b->oom = true;
      else if (!strcmp(in.p, "object | object") || utf8_chars(in.p) > 50) chat_put(b, "any[]");
      else chat_put(b, in.p), chat_put(b, "[]");
      mole_free(in.p);
    }
    if (truthy(nullable)) chat_put(b, " | null");
    return;
  }
  if (cJSON_IsArray(type) && type->child) {  // a list of types
    const cJSON *x;
    cJSON_ArrayForEach(x, type) {
      if (x != type->child) chat_put(b, " | ");
      put_str_value(b, x);
    }
    return;
  }
  const cJSON *one = get(spec, "oneOf");
  if (cJSON_IsArray(one) && one->child) {
    const cJSON *v;
    cJSON_ArrayForEach(v, one) {
      ts_type(b, v);
      const cJSON *d = get(v, "description"), *def = get(v, "default");
      if (truthy(d)) chat_put(b, "// "), put_str_value(b, d);
      if (def) chat_put(b, "                    // default: "), chat_put_json(b, def);
      if (v->next) chat_put(b, " | \n");
    }
    return;
  }
  if (is_type(spec, "string")) {
    const cJSON *en = get(spec, "enum");
    if (cJSON_IsArray(en) && en->child) {
      const cJSON *x;
      chat_put(b, "\"");
      cJSON_ArrayForEach(x, en) {
        if (x != en->child) chat_put(b, "\" | \"");
        put_str_value(b, x);
      }
      chat_put(b, "\"");
    } else {
      chat_put(b, "string");
      if (truthy(nullable)) chat_put(b, " | null");
    }
  } else if (is_type(spec, "number") || is_type(spec, "integer")) {
    chat_put(b, "number");
  } else if (is_type(spec, "boolean")) {
    chat_put(b, "boolean");
  } else if (is_type(spec, "object")) {
    const cJSON *props = get(spec, "properties"), *req = get(spec, "required");
    if (cJSON_IsObject(props) && props->child) {
      const cJSON *p;
      chat_put(b, "{\n");
      cJSON_ArrayForEach(p, props) {
        chat_put(b, p->string);
        if (!in_list(req, p->string)) chat_put(b, "?");
        chat_put(b, ": \n                ");
        ts_type(b, p);
        if (p->next) chat_put(b, ", ");
      }
      chat_put(b, "}");
    } else {
      chat_put(b, "object");
    }
  } else {
    chat_put(b, "any");
  }
}

// The template's render_tool_namespace("functions", tools).
static mole_status harmony_tools(chat_buf *b, const cJSON *tools) {
  chat_put(b, "## functions\n\nnamespace functions {\n\n");
  const cJSON *t;
  int64_t k = 0;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *fn = get(t, "function"), *name = get(fn, "name"), *desc = get(fn, "description");
    if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0])
      return mole_errorf(MOLE_ERR_ARG, "chat: tools[%lld] is not {\"type\": \"function\", \"function\": {\"name\": "
                         "string, ...}}", (long long)k);
    chat_put(b, "// ");
    if (desc) put_str_value(b, desc);  // (a tool without one: the template fails; we write an empty comment)
    chat_put(b, "\ntype ");
    chat_put(b, name->valuestring);
    chat_put(b, " = ");
    const cJSON *params = get(fn, "parameters"), *props = get(params, "properties"), *req = get(params, "required");
    if (cJSON_IsObject(props) && props->child) {
      const cJSON *p;
      chat_put(b, "(_: {\n");
      cJSON_ArrayForEach(p, props) {
        const cJSON *d = get(p, "description"), *def = get(p, "default");
        if (truthy(d)) chat_put(b, "// "), put_str_value(b, d), chat_put(b, "\n");
        chat_put(b, p->string);
        if (!in_list(req, p->string)) chat_put(b, "?");
        chat_put(b, ": ");
        ts_type(b, p);
        if (def) {
          if (truthy(get(p, "enum"))) chat_put(b, ", // default: "), put_str_value(b, def);
          else if (truthy(get(p, "oneOf"))) chat_put(b, "// default: "), put_str_value(b, def);
          else chat_put(b, ", // default: "), chat_put_json(b, def);
        }
        chat_put(b, ",\n");
      }
      chat_put(b, "}) => any;\n\n");
    } else {
      chat_put(b, "() => any;\n\n");
    }
    k++;
  }
  chat_put(b, "} // namespace functions");
  return MOLE_OK;
}

// ---- the conversation -----------------------------------------------------------------------

static bool has_channel_tags(const char *s) {
  return s && (strstr(s, "<|channel|>analysis<|message|>") || strstr(s, "<|channel|>final<|message|>"));
}

static void harmony_analysis(chat_buf *b, const char *text) {
  chat_put(b, "<|start|>assistant<|channel|>analysis<|message|>");
  chat_put(b, text);
  chat_put(b, "<|end|>");
}

static mole_status harmony_call(chat_buf *b, const chat_turn *t, int64_t i) {
  chat_put(b, "<|start|>assistant to=functions.");
  chat_put(b, t->tool_name);
  chat_put(b, "<|channel|>commentary json<|message|>");
  if (!t->tool_args) {
    chat_put(b, "{}");
  } else {
    cJSON *args = cJSON_Parse(t->tool_args);
    if (!args) return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: the tool call's arguments are not JSON", (long long)i);
    chat_put_json(b, args);
    cJSON_Delete(args);
  }
  chat_put(b, "<|call|>");
  return MOLE_OK;
}

static mole_status harmony_turns(chat_buf *b, const chat_turn *t, int64_t n, int64_t first, bool add_ass) {
  const char *last_call = NULL;
  for (int64_t i = first; i < n; i++) {
    const char *role = t[i].role, *content = t[i].content ? t[i].content : "";
    if (!strcmp(role, "assistant")) {
      if (has_channel_tags(t[i].content) || has_channel_tags(t[i].reasoning))
        return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: an assistant %s holds <|channel|> tags; pass the analysis "
                           "as its reasoning and the final answer as its content", (long long)i,
                           has_channel_tags(t[i].content) ? "content" : "reasoning");
      if (t[i].tool_name) {
        bool later_answer = false;
        for (int64_t j = i + 1; j < n; j++) later_answer |= !strcmp(t[j].role, "assistant") && !t[j].tool_name;
        const bool has_c = content[0], has_r = t[i].reasoning && t[i].reasoning[0];
        if (has_c && has_r)
          return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: an assistant tool call with both content and "
                             "reasoning (give its analysis in one of them)", (long long)i);
        if ((has_c || has_r) && !later_answer) harmony_analysis(b, has_c ? content : t[i].reasoning);
        mole_status st = harmony_call(b, &t[i], i);
        if (st != MOLE_OK) return st;
        last_call = t[i].tool_name;
      } else if (i == n - 1 && !add_ass) {  // training form: the last answer ends the output
        if (t[i].reasoning) harmony_analysis(b, t[i].reasoning);
        chat_put(b, "<|start|>assistant<|channel|>final<|message|>");
        chat_put(b, content);
        chat_put(b, "<|return|>");
      } else {  // earlier answers without their reasoning
        chat_put(b, "<|start|>assistant<|channel|>final<|message|>");
        chat_put(b, content);
        chat_put(b, "<|end|>");
        last_call = NULL;
      }
    } else if (!strcmp(role, "tool")) {
      if (!last_call)
        return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: a tool result with no assistant tool call before it",
                           (long long)i);
      chat_put(b, "<|start|>functions.");
      chat_put(b, last_call);
      chat_put(b, " to=assistant<|channel|>commentary<|message|>");
      if (t[i].content) chat_put_json_str(b, t[i].content, strlen(t[i].content));
      else chat_put(b, "null");
      chat_put(b, "<|end|>");
    } else if (!strcmp(role, "user")) {
      chat_put(b, "<|start|>user<|message|>");
      chat_put(b, content);
      chat_put(b, "<|end|>");
    }  // a later system or developer message: the template drops it
  }
  if (add_ass) chat_put(b, "<|start|>assistant");
  return MOLE_OK;
}

mole_status chat_harmony_render(chat_buf *b, const chat_turn *t, int64_t n, bool add_ass, const chat_options *opt) {
  const char *effort = opt && opt->reasoning_effort ? opt->reasoning_effort : "medium";
  if (strcmp(effort, "low") && strcmp(effort, "medium") && strcmp(effort, "high"))
    return mole_errorf(MOLE_ERR_ARG, "chat: reasoning effort \"%.40s\": expected low, medium or high", effort);
  cJSON *tools = NULL;
  if (opt && opt->tools) {
    tools = cJSON_Parse(opt->tools);
    if (!cJSON_IsArray(tools)) {
      cJSON_Delete(tools);
      return mole_errorf(MOLE_ERR_ARG, "chat: tools: not a JSON array");
    }
  }
  const bool has_tools = truthy(tools);
  char today[16];
  const char *date = opt ? opt->date : NULL;
  if (!date) {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(today, sizeof today, "%Y-%m-%d", &tm);
    date = today;
  }

  chat_put(b, "<|start|>system<|message|>");
  chat_put(b, opt && opt->model_identity ? opt->model_identity
                                         : "You are ChatGPT, a large language model trained by OpenAI.");
  chat_put(b, "\nKnowledge cutoff: 2024-06\nCurrent date: ");
  chat_put(b, date);
  chat_put(b, "\n\nReasoning: ");
  chat_put(b, effort);
  chat_put(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
  if (has_tools) chat_put(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
  chat_put(b, "<|end|>");

  int64_t first = 0;
  const char *dev = "";
  if (n > 0 && (!strcmp(t[0].role, "system") || !strcmp(t[0].role, "developer"))) {
    dev = t[0].content ? t[0].content : "";
    first = 1;
  }
  mole_status st = MOLE_OK;
  if (dev[0] || has_tools) {
    chat_put(b, "<|start|>developer<|message|>");
    if (dev[0]) {
      chat_put(b, "# Instructions\n\n");
      chat_put(b, dev);
      chat_put(b, "\n\n");
    }
    if (has_tools) {
      chat_put(b, "# Tools\n\n");
      st = harmony_tools(b, tools);
    }
    chat_put(b, "<|end|>");
  }
  cJSON_Delete(tools);
  if (st == MOLE_OK) st = harmony_turns(b, t, n, first, add_ass);
  return st;
}
