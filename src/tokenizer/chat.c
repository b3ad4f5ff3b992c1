// tokenizer/chat: recognise tokenizer.chat_template families and render
// conversations the way llama.cpp's built-in templates do.
#include <string.h>

#include "tokenizer/chat_internal.h"

// ---- names ----------------------------------------------------------------

static const char *const chat_canonical[CHAT_TMPL_COUNT] = {
    [CHAT_TMPL_UNKNOWN] = "unknown",
    [CHAT_TMPL_CHATML] = "chatml",
    [CHAT_TMPL_LLAMA2] = "llama2",
    [CHAT_TMPL_LLAMA2_SYS] = "llama2-sys",
    [CHAT_TMPL_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [CHAT_TMPL_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [CHAT_TMPL_MISTRAL_V1] = "mistral-v1",
    [CHAT_TMPL_MISTRAL_V3] = "mistral-v3",
    [CHAT_TMPL_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_TMPL_MISTRAL_V7] = "mistral-v7",
    [CHAT_TMPL_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [CHAT_TMPL_LLAMA3] = "llama3",
    [CHAT_TMPL_DEEPSEEK] = "deepseek",
    [CHAT_TMPL_DEEPSEEK2] = "deepseek2",
    [CHAT_TMPL_DEEPSEEK3] = "deepseek3",
    [CHAT_TMPL_ZEPHYR] = "zephyr",
    [CHAT_TMPL_TULU] = "tulu",
    [CHAT_TMPL_GPT_OSS] = "gpt-oss",
    [CHAT_TMPL_GLM45] = "glm4.5",
    [CHAT_TMPL_GLM47] = "glm4.7",
    [CHAT_TMPL_QWEN3] = "qwen3",
    [CHAT_TMPL_QWEN35] = "qwen3.5",
    [CHAT_TMPL_GEMMA4] = "gemma4",
};

static const struct {
  const char *name;
  chat_tmpl t;
} chat_aliases[] = {
    {"mistral", CHAT_TMPL_LLAMA2},
    {"qwen2", CHAT_TMPL_CHATML},
    {"olmoe", CHAT_TMPL_TULU},
    {"harmony", CHAT_TMPL_GPT_OSS},
    {"glm4.6", CHAT_TMPL_GLM45},
};

chat_tmpl chat_template_from_name(const char *name) {
  if (!name) return CHAT_TMPL_UNKNOWN;
  for (int t = 1; t < CHAT_TMPL_COUNT; t++)
    if (strcmp(name, chat_canonical[t]) == 0) return (chat_tmpl)t;
  for (size_t i = 0; i < sizeof(chat_aliases) / sizeof(chat_aliases[0]); i++)
    if (strcmp(name, chat_aliases[i].name) == 0) return chat_aliases[i].t;
  return CHAT_TMPL_UNKNOWN;
}

const char *chat_template_name(chat_tmpl t) {
  if ((int)t <= 0 || (int)t >= CHAT_TMPL_COUNT) return chat_canonical[CHAT_TMPL_UNKNOWN];
  return chat_canonical[t];
}

const char *chat_template_list(void) {
  return "chatml (alias qwen2), qwen3, qwen3.5, llama2 (alias mistral), llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, "
         "mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, llama3, deepseek, deepseek2, "
         "deepseek3, zephyr, tulu (alias olmoe), gpt-oss (alias harmony), glm4.5 (alias glm4.6), glm4.7, gemma4";
}

// ---- detection ------------------------------------------------------------

static bool chat_has(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

// Templates with "<|user|>" and "<|assistant|>" (and no "</s>", which would
// make them Falcon 3): llama.cpp calls them all glmedge. We tell apart the
// kinds we render by the user-message expression of the template: zephyr
// ends it with the EOS, tulu (OLMoE) does not; glmedge writes its role tags
// outside any {{ }} expression, so it has no quoted '<|user|>'.
static chat_tmpl chat_detect_user_assistant(const char *tmpl) {
  const char *u = strstr(tmpl, "'<|user|>");
  if (!u) u = strstr(tmpl, "\"<|user|>");
  if (!u) return CHAT_TMPL_UNKNOWN;
  const char *end = strstr(u, "}}");
  size_t n = end ? (size_t)(end - u) : strlen(u);
  static const char *const eos_marks[] = {"eos_token", "<|endoftext|>", "</s>"};
  for (size_t i = 0; i < sizeof(eos_marks) / sizeof(eos_marks[0]); i++) {
    const char *e = strstr(u, eos_marks[i]);
    if (e && (size_t)(e - u) < n) return CHAT_TMPL_ZEPHYR;
  }
  return CHAT_TMPL_TULU;
}

// The [INST] families, in llama.cpp's order of tests.
static chat_tmpl chat_detect_inst(const char *tmpl) {
  if (chat_has(tmpl, "[SYSTEM_PROMPT]")) return CHAT_TMPL_MISTRAL_V7;
  if (chat_has(tmpl, "' [INST] ' + system_message") || chat_has(tmpl, "[AVAILABLE_TOOLS]")) {
    if (chat_has(tmpl, " [INST]")) return CHAT_TMPL_MISTRAL_V1;
    if (chat_has(tmpl, "\"[INST]\"")) return CHAT_TMPL_MISTRAL_V3_TEKKEN;
    return CHAT_TMPL_MISTRAL_V3;
  }
  if (chat_has(tmpl, "content.strip()")) return CHAT_TMPL_LLAMA2_SYS_STRIP;
  if (chat_has(tmpl, "bos_token + '[INST]")) return CHAT_TMPL_LLAMA2_SYS_BOS;
  if (chat_has(tmpl, "<<SYS>>")) return CHAT_TMPL_LLAMA2_SYS;
  return CHAT_TMPL_LLAMA2;
}

// Follows llama.cpp's llm_chat_detect_template test by test, so a template
// lands in the same family; families llama.cpp knows and we do not render
// give CHAT_TMPL_UNKNOWN rather than falling through to a later, wrong test.
chat_tmpl chat_template_detect(const char *tmpl) {
  if (!tmpl) return CHAT_TMPL_UNKNOWN;
  chat_tmpl t = chat_template_from_name(tmpl);
  if (t != CHAT_TMPL_UNKNOWN) return t;

  if (chat_has(tmpl, "<|im_start|>")) {
    // phi-4 and SmolVLM use <|im_start|> but are not ChatML
    if (chat_has(tmpl, "<|im_sep|>") || chat_has(tmpl, "<end_of_utterance>")) return CHAT_TMPL_UNKNOWN;
    // (llama.cpp calls them all chatml) Qwen3 and 3.5 think: their templates render reasoning
    if (chat_has(tmpl, "reasoning_content") && chat_has(tmpl, "<think>")) {
      if (chat_has(tmpl, "{{- '<think>\\n' }}")) return CHAT_TMPL_QWEN35;
      if (chat_has(tmpl, "enable_thinking")) return CHAT_TMPL_QWEN3;
    }
    return CHAT_TMPL_CHATML;
  }
  if (strncmp(tmpl, "mistral", 7) == 0 || chat_has(tmpl, "[INST]")) return chat_detect_inst(tmpl);
  if (chat_has(tmpl, "<|assistant|>") && chat_has(tmpl, "<|end|>")) return CHAT_TMPL_UNKNOWN;  // phi-3
  if (chat_has(tmpl, "[gMASK]<sop>")) {  // llama.cpp's chatglm4; GLM-4.5+ think and call tools
    if (!chat_has(tmpl, "<think>") || !chat_has(tmpl, "<|observation|>")) return CHAT_TMPL_UNKNOWN;  // GLM-4
    return chat_has(tmpl, "else '<think>'") ? CHAT_TMPL_GLM47 : CHAT_TMPL_GLM45;
  }
  if (chat_has(tmpl, "<|assistant|>") && chat_has(tmpl, "<|user|>")) {
    if (chat_has(tmpl, "</s>")) return CHAT_TMPL_UNKNOWN;  // falcon 3
    return chat_detect_user_assistant(tmpl);
  }
  if (chat_has(tmpl, "<|{{ item['role'] }}|>") && chat_has(tmpl, "<|begin_of_image|>"))
    return CHAT_TMPL_UNKNOWN;  // glmedge
  if (chat_has(tmpl, "<|user|>") && chat_has(tmpl, "<|endoftext|>")) return CHAT_TMPL_ZEPHYR;
  if (chat_has(tmpl, "bos_token + message['role']")) return CHAT_TMPL_UNKNOWN;        // monarch
  if (chat_has(tmpl, "<start_of_turn>")) return CHAT_TMPL_UNKNOWN;                    // gemma
  if (chat_has(tmpl, "'\\n\\nAssistant: ' + eos_token")) return CHAT_TMPL_UNKNOWN;    // orion
  if (chat_has(tmpl, "GPT4 Correct ")) return CHAT_TMPL_UNKNOWN;                      // openchat
  if (chat_has(tmpl, "USER: ") && chat_has(tmpl, "ASSISTANT: ")) return CHAT_TMPL_UNKNOWN;  // vicuna
  if (chat_has(tmpl, "### Instruction:") && chat_has(tmpl, "<|EOT|>")) return CHAT_TMPL_DEEPSEEK;
  if (chat_has(tmpl, "<|START_OF_TURN_TOKEN|>") && chat_has(tmpl, "<|USER_TOKEN|>"))
    return CHAT_TMPL_UNKNOWN;  // command-r
  if (chat_has(tmpl, "<|start_header_id|>") && chat_has(tmpl, "<|end_header_id|>")) return CHAT_TMPL_LLAMA3;
  if (chat_has(tmpl, "[gMASK]sop")) return CHAT_TMPL_UNKNOWN;       // chatglm3
  if (chat_has(tmpl, "<用户>")) return CHAT_TMPL_UNKNOWN;  // minicpm
  if (chat_has(tmpl, "'Assistant: ' + message['content'] + eos_token")) return CHAT_TMPL_DEEPSEEK2;
  if (chat_has(tmpl, "<｜Assistant｜>") && chat_has(tmpl, "<｜User｜>") && chat_has(tmpl, "<｜end▁of▁sentence｜>"))
    return CHAT_TMPL_DEEPSEEK3;
  // (llama.cpp's tests between these: exaone, rwkv-world, granite, gigachat, megrez, yandex, bailing,
  // llama4, dots1, hunyuan-moe; none of their templates holds both harmony markers)
  if (chat_has(tmpl, "<|start|>") && chat_has(tmpl, "<|channel|>")) return CHAT_TMPL_GPT_OSS;
  if (chat_has(tmpl, "<|turn>") && chat_has(tmpl, "<turn|>")) return CHAT_TMPL_GEMMA4;
  return CHAT_TMPL_UNKNOWN;
}

// ---- rendering --------------------------------------------------------------

void chat_put_n(chat_buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (n > SIZE_MAX / 4 - b->len) {
    b->oom = true;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = mole_realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void chat_put(chat_buf *b, const char *s) { chat_put_n(b, s, strlen(s)); }

// llama.cpp's trim: C-locale isspace at both ends
static bool chat_is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

static void chat_put_trimmed(chat_buf *b, const char *s) {
  size_t n = strlen(s), i = 0;
  while (i < n && chat_is_space(s[i])) i++;
  while (n > i && chat_is_space(s[n - 1])) n--;
  chat_put_n(b, s + i, n - i);
}

typedef enum { CHAT_ROLE_SYSTEM, CHAT_ROLE_USER, CHAT_ROLE_ASSISTANT } chat_role;

static void chat_render_inst_mistral(chat_buf *b, chat_tmpl t, const chat_msg *m, const chat_role *r, int64_t n) {
  // v1/v3/v3-tekken: a turn opens with [INST] before the first message after an answer
  const char *lead = t == CHAT_TMPL_MISTRAL_V1 ? " " : "";
  const char *trail = t == CHAT_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
  bool inside = false;
  for (int64_t i = 0; i < n; i++) {
    if (!inside) {
      chat_put(b, lead);
      chat_put(b, "[INST]");
      chat_put(b, trail);
      inside = true;
    }
    if (r[i] == CHAT_ROLE_SYSTEM) {
      chat_put(b, m[i].content);
      chat_put(b, "\n\n");
    } else if (r[i] == CHAT_ROLE_USER) {
      chat_put(b, m[i].content);
      chat_put(b, lead);
      chat_put(b, "[/INST]");
    } else {
      chat_put(b, trail);
      if (t == CHAT_TMPL_MISTRAL_V3)
        chat_put_trimmed(b, m[i].content);
      else
        chat_put(b, m[i].content);
      chat_put(b, "</s>");
      inside = false;
    }
  }
}

static void chat_render_llama2(chat_buf *b, chat_tmpl t, const chat_msg *m, const chat_role *r, int64_t n) {
  const bool sys_tags = t != CHAT_TMPL_LLAMA2;
  const bool bos_inside = t == CHAT_TMPL_LLAMA2_SYS_BOS;
  const bool strip = t == CHAT_TMPL_LLAMA2_SYS_STRIP;
  bool inside = true;  // the first [INST] is written here, without BOS
  chat_put(b, "[INST] ");
  for (int64_t i = 0; i < n; i++) {
    if (!inside) {
      inside = true;
      chat_put(b, bos_inside ? "<s>[INST] " : "[INST] ");
    }
    if (r[i] == CHAT_ROLE_SYSTEM) chat_put(b, sys_tags ? "<<SYS>>\n" : "");
    if (strip)
      chat_put_trimmed(b, m[i].content);
    else
      chat_put(b, m[i].content);
    if (r[i] == CHAT_ROLE_SYSTEM) {
      chat_put(b, sys_tags ? "\n<</SYS>>\n\n" : "\n");  // without <<SYS>> the system text joins the first turn
    } else if (r[i] == CHAT_ROLE_USER) {
      chat_put(b, " [/INST]");
    } else {
      chat_put(b, "</s>");
      inside = false;
    }
  }
}

static void chat_render(chat_buf *b, chat_tmpl t, const chat_msg *m, const chat_role *r, int64_t n, bool add_ass) {
  static const char *const role_name[] = {"system", "user", "assistant"};
  switch (t) {
    case CHAT_TMPL_CHATML:
      for (int64_t i = 0; i < n; i++) {
        chat_put(b, "<|im_start|>");
        chat_put(b, role_name[r[i]]);
        chat_put(b, "\n");
        chat_put(b, m[i].content);
        chat_put(b, "<|im_end|>\n");
      }
      if (add_ass) chat_put(b, "<|im_start|>assistant\n");
      break;
    case CHAT_TMPL_MISTRAL_V7:
    case CHAT_TMPL_MISTRAL_V7_TEKKEN: {
      const char *sp = t == CHAT_TMPL_MISTRAL_V7 ? " " : "";
      for (int64_t i = 0; i < n; i++) {
        if (r[i] == CHAT_ROLE_SYSTEM) {
          chat_put(b, "[SYSTEM_PROMPT]");
          chat_put(b, sp);
          chat_put(b, m[i].content);
          chat_put(b, "[/SYSTEM_PROMPT]");
        } else if (r[i] == CHAT_ROLE_USER) {
          chat_put(b, "[INST]");
          chat_put(b, sp);
          chat_put(b, m[i].content);
          chat_put(b, "[/INST]");
        } else {
          chat_put(b, sp);
          chat_put(b, m[i].content);
          chat_put(b, "</s>");
        }
      }
      break;
    }
    case CHAT_TMPL_MISTRAL_V1:
    case CHAT_TMPL_MISTRAL_V3:
    case CHAT_TMPL_MISTRAL_V3_TEKKEN:
      chat_render_inst_mistral(b, t, m, r, n);
      break;
    case CHAT_TMPL_LLAMA2:
    case CHAT_TMPL_LLAMA2_SYS:
    case CHAT_TMPL_LLAMA2_SYS_BOS:
    case CHAT_TMPL_LLAMA2_SYS_STRIP:
      chat_render_llama2(b, t, m, r, n);
      break;
    case CHAT_TMPL_LLAMA3:
      for (int64_t i = 0; i < n; i++) {
        chat_put(b, "<|start_header_id|>");
        chat_put(b, role_name[r[i]]);
        chat_put(b, "<|end_header_id|>\n\n");
        chat_put_trimmed(b, m[i].content);
        chat_put(b, "<|eot_id|>");
      }
      if (add_ass) chat_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case CHAT_TMPL_DEEPSEEK:
      for (int64_t i = 0; i < n; i++) {
        static const char *const pre[] = {"", "### Instruction:\n", "### Response:\n"};
        static const char *const post[] = {"", "\n", "\n<|EOT|>\n"};
        chat_put(b, pre[r[i]]);
        chat_put(b, m[i].content);
        chat_put(b, post[r[i]]);
      }
      if (add_ass) chat_put(b, "### Response:\n");
      break;
    case CHAT_TMPL_DEEPSEEK2:
      for (int64_t i = 0; i < n; i++) {
        static const char *const pre[] = {"", "User: ", "Assistant: "};
        static const char *const post[] = {"\n\n", "\n\n", "<｜end▁of▁sentence｜>"};
        chat_put(b, pre[r[i]]);
        chat_put(b, m[i].content);
        chat_put(b, post[r[i]]);
      }
      if (add_ass) chat_put(b, "Assistant:");
      break;
    case CHAT_TMPL_DEEPSEEK3:
      for (int64_t i = 0; i < n; i++) {
        static const char *const pre[] = {"", "<｜User｜>", "<｜Assistant｜>"};
        static const char *const post[] = {"\n\n", "", "<｜end▁of▁sentence｜>"};
        chat_put(b, pre[r[i]]);
        chat_put(b, m[i].content);
        chat_put(b, post[r[i]]);
      }
      if (add_ass) chat_put(b, "<｜Assistant｜>");
      break;
    case CHAT_TMPL_ZEPHYR:
    case CHAT_TMPL_TULU:
      for (int64_t i = 0; i < n; i++) {
        chat_put(b, "<|");
        chat_put(b, role_name[r[i]]);
        chat_put(b, "|>\n");
        chat_put(b, m[i].content);
        if (t == CHAT_TMPL_ZEPHYR || r[i] == CHAT_ROLE_ASSISTANT)
          chat_put(b, "<|endoftext|>\n");
        else
          chat_put(b, "\n");
      }
      if (add_ass) chat_put(b, "<|assistant|>\n");
      break;
    case CHAT_TMPL_GPT_OSS:  // chat_harmony_render
    case CHAT_TMPL_GLM45:    // chat_glm_render
    case CHAT_TMPL_GLM47:
    case CHAT_TMPL_QWEN3:    // chat_qwen_render
    case CHAT_TMPL_QWEN35:
    case CHAT_TMPL_GEMMA4:   // chat_gemma_render
    case CHAT_TMPL_UNKNOWN:
    case CHAT_TMPL_COUNT:
      MOLE_ASSERT(!"chat_render: not a llama.cpp format");
  }
}

static mole_status chat_check_family(chat_tmpl tmpl) {
  if ((int)tmpl <= CHAT_TMPL_UNKNOWN || (int)tmpl >= CHAT_TMPL_COUNT)
    return mole_errorf(MOLE_ERR_ARG, "chat: unknown chat template; choose one with --template NAME (%s)",
                       chat_template_list());
  return MOLE_OK;
}

static mole_status chat_done(chat_buf *b, mole_status st, char **out) {
  if (st == MOLE_OK && b->oom) st = mole_errorf(MOLE_ERR_NOMEM, "chat: out of memory");
  if (st != MOLE_OK) {
    mole_free(b->p);
    return st;
  }
  *out = b->p;
  return MOLE_OK;
}

mole_status chat_format_turns(chat_tmpl tmpl, const chat_turn *turns, int64_t n, bool add_assistant_prompt,
                              const chat_options *opt, char **out) {
  MOLE_ASSERT(out != NULL);
  *out = NULL;
  mole_status st = chat_check_family(tmpl);
  if (st != MOLE_OK) return st;
  if (n < 0 || (n > 0 && !turns)) return mole_errorf(MOLE_ERR_ARG, "chat: bad message count %lld", (long long)n);
  const bool harmony = tmpl == CHAT_TMPL_GPT_OSS, glm = tmpl == CHAT_TMPL_GLM45 || tmpl == CHAT_TMPL_GLM47,
             qwen = tmpl == CHAT_TMPL_QWEN3 || tmpl == CHAT_TMPL_QWEN35, gemma = tmpl == CHAT_TMPL_GEMMA4;
  static const char *const roles[] = {"system", "user", "assistant", "developer", "tool"};
  for (int64_t i = 0; i < n; i++) {
    const char *role = turns[i].role;
    if (!role) return mole_errorf(MOLE_ERR_ARG, "chat: message %lld has no role", (long long)i);
    int r = 0;
    while (r < 5 && strcmp(role, roles[r])) r++;
    if (r == 5 || (!harmony && r >= 3 && !(gemma && r == 3)))
      return mole_errorf(MOLE_ERR_ARG, "chat: message %lld has role \"%.64s\"; %s takes %s", (long long)i, role,
                         chat_template_name(tmpl),
                         harmony  ? "system, developer, user, assistant or tool"
                         : gemma ? "system, developer, user or assistant"
                                 : "system, user or assistant");
    if (!harmony && !glm && !qwen && !gemma && !turns[i].content)
      return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: no content", (long long)i);
    if (!harmony && turns[i].tool_name)
      return mole_errorf(MOLE_ERR_ARG, "chat: message %lld: a tool call, which only gpt-oss renders", (long long)i);
  }
  chat_buf b = {0};
  chat_put(&b, "");  // an empty conversation still gives a string
  if (harmony) {
    st = chat_harmony_render(&b, turns, n, add_assistant_prompt, opt);
  } else if (glm) {
    st = chat_glm_render(&b, tmpl == CHAT_TMPL_GLM47, turns, n, add_assistant_prompt, opt);
  } else if (qwen) {
    st = chat_qwen_render(&b, tmpl == CHAT_TMPL_QWEN35, turns, n, add_assistant_prompt, opt);
  } else if (gemma) {
    st = chat_gemma_render(&b, turns, n, add_assistant_prompt, opt);
  } else {
    chat_msg *m = mole_malloc((size_t)(n > 0 ? n : 1) * sizeof *m);
    chat_role *r = mole_malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    if (m && r) {
      for (int64_t i = 0; i < n; i++) {
        m[i] = (chat_msg){turns[i].role, turns[i].content};
        r[i] = !strcmp(turns[i].role, "system") ? CHAT_ROLE_SYSTEM
               : !strcmp(turns[i].role, "user") ? CHAT_ROLE_USER
                                                : CHAT_ROLE_ASSISTANT;
      }
      chat_render(&b, tmpl, m, r, n, add_assistant_prompt);
    } else {
      b.oom = true;
    }
    mole_free(m);
    mole_free(r);
  }
  return chat_done(&b, st, out);
}

mole_status chat_format(chat_tmpl tmpl, const chat_msg *msgs, int64_t n, bool add_assistant_prompt, char **out) {
  MOLE_ASSERT(out != NULL);
  *out = NULL;
  mole_status st = chat_check_family(tmpl);
  if (st != MOLE_OK) return st;
  if (n < 0 || (n > 0 && !msgs)) return mole_errorf(MOLE_ERR_ARG, "chat: bad message count %lld", (long long)n);
  chat_turn *t = mole_calloc((size_t)(n > 0 ? n : 1), sizeof *t);
  if (!t) return mole_errorf(MOLE_ERR_NOMEM, "chat: out of memory");
  for (int64_t i = 0; i < n && st == MOLE_OK; i++) {
    const char *role = msgs[i].role;
    if (!role || !msgs[i].content)
      st = mole_errorf(MOLE_ERR_ARG, "chat: message %lld has no %s", (long long)i, role ? "content" : "role");
    else if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
      st = mole_errorf(MOLE_ERR_ARG, "chat: message %lld has role \"%.64s\"; expected system, user or assistant",
                       (long long)i, role);
    t[i] = (chat_turn){.role = role, .content = msgs[i].content};
  }
  if (st == MOLE_OK) st = chat_format_turns(tmpl, t, n, add_assistant_prompt, NULL, out);
  mole_free(t);
  return st;
}
