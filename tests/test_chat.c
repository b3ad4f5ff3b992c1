// tokenizer/chat: template detection on real tokenizer.chat_template strings
// (tests/data/chat/, see README.md there) and the exact prompts per family.
// The conversation and most expected strings are llama.cpp's own test data
// (tests/test-chat-template.cpp, MIT licence); the others are derived from
// llama.cpp's src/llama-chat.cpp, or (tulu) rendered from the model's own
// template with transformers' Jinja settings.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tokenizer/chat.h"

static const chat_msg k_conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV ((int64_t)(sizeof(k_conv) / sizeof(k_conv[0])))

static const struct {
  chat_tmpl t;
  const char *want;  // k_conv with the assistant prompt
} k_expect[] = {
    {CHAT_TMPL_CHATML,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
     "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
     "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
     "<|im_start|>assistant\n"},
    // Mistral-7B-Instruct-v0.2 / Mixtral-8x7B-Instruct-v0.1 (first template)
    {CHAT_TMPL_LLAMA2,
     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   "
     "</s>[INST] Another question [/INST]"},
    // derived from llama-chat.cpp
    {CHAT_TMPL_LLAMA2_SYS,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
     "   I am an assistant   </s>[INST] Another question [/INST]"},
    // TheBloke/FusionNet_34Bx2_MoE-AWQ
    {CHAT_TMPL_LLAMA2_SYS_BOS,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]"
     "   I am an assistant   </s><s>[INST] Another question [/INST]"},
    // bofenghuang/vigogne-2-70b-chat
    {CHAT_TMPL_LLAMA2_SYS_STRIP,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
     "I am an assistant</s>[INST] Another question [/INST]"},
    // Mixtral-8x7B-Instruct-v0.1 (current template, system prompt)
    {CHAT_TMPL_MISTRAL_V1,
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an "
     "assistant   </s> [INST] Another question [/INST]"},
    {CHAT_TMPL_MISTRAL_V3,
     "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
     "[INST] Another question[/INST]"},
    {CHAT_TMPL_MISTRAL_V3_TEKKEN,
     "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   "
     "</s>[INST]Another question[/INST]"},
    {CHAT_TMPL_MISTRAL_V7,
     "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you"
     "[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
    // derived from llama-chat.cpp
    {CHAT_TMPL_MISTRAL_V7_TEKKEN,
     "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>[INST]Who are you"
     "[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {CHAT_TMPL_LLAMA3,
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user"
     "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant"
     "<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question"
     "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    // deepseek-coder-33b-instruct
    {CHAT_TMPL_DEEPSEEK,
     "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\n"
     "Who are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n"
     "### Response:\n"},
    {CHAT_TMPL_DEEPSEEK2,
     "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>User: Who are you\n\n"
     "Assistant:    I am an assistant   <｜end▁of▁sentence｜>User: Another question\n\nAssistant:"},
    {CHAT_TMPL_DEEPSEEK3,
     "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Who are you"
     "<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another question<｜Assistant｜>"},
    {CHAT_TMPL_ZEPHYR,
     "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi there"
     "<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   <|endoftext|>\n"
     "<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n"},
    // OLMoE-1B-7B-0924-Instruct's template rendered by jinja2 (trim_blocks,
    // lstrip_blocks), less its leading bos_token
    {CHAT_TMPL_TULU,
     "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there<|endoftext|>\n<|user|>\n"
     "Who are you\n<|assistant|>\n   I am an assistant   <|endoftext|>\n<|user|>\nAnother question\n"
     "<|assistant|>\n"},
};

static void test_format_families(void **st) {
  (void)st;
  bool covered[CHAT_TMPL_COUNT] = {0};
  for (size_t i = 0; i < sizeof(k_expect) / sizeof(k_expect[0]); i++) {
    char *out = NULL;
    assert_int_equal(chat_format(k_expect[i].t, k_conv, N_CONV, true, &out), MOLE_OK);
    if (strcmp(out, k_expect[i].want) != 0)
      fail_msg("%s:\nwant: [%s]\ngot:  [%s]", chat_template_name(k_expect[i].t), k_expect[i].want, out);
    mole_free(out);
    covered[k_expect[i].t] = true;
  }
  // checked against their own templates in tests/test_chat_ref.c (gpt-oss's prompts are dated)
  covered[CHAT_TMPL_GPT_OSS] = covered[CHAT_TMPL_GLM45] = covered[CHAT_TMPL_GLM47] = true;
  covered[CHAT_TMPL_QWEN3] = covered[CHAT_TMPL_QWEN35] = covered[CHAT_TMPL_GEMMA4] = true;
  for (int t = 1; t < CHAT_TMPL_COUNT; t++)
    if (!covered[t]) fail_msg("no expected output for %s", chat_template_name((chat_tmpl)t));
}

// [system, user, assistant, user] without the assistant prompt
static void test_format_no_prompt(void **st) {
  (void)st;
  static const struct {
    chat_tmpl t;
    const char *want;
  } cases[] = {
      {CHAT_TMPL_CHATML,
       "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
       "<|im_start|>user\nU2<|im_end|>\n"},
      {CHAT_TMPL_LLAMA3,
       "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU1"
       "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|><|start_header_id|>user"
       "<|end_header_id|>\n\nU2<|eot_id|>"},
      {CHAT_TMPL_MISTRAL_V1, " [INST] S\n\nU1 [/INST] A1</s> [INST] U2 [/INST]"},
      {CHAT_TMPL_LLAMA2, "[INST] S\nU1 [/INST]A1</s>[INST] U2 [/INST]"},
      {CHAT_TMPL_DEEPSEEK3, "S\n\n<｜User｜>U1<｜Assistant｜>A1<｜end▁of▁sentence｜><｜User｜>U2"},
      {CHAT_TMPL_DEEPSEEK2, "S\n\nUser: U1\n\nAssistant: A1<｜end▁of▁sentence｜>User: U2\n\n"},
      {CHAT_TMPL_TULU, "<|system|>\nS\n<|user|>\nU1\n<|assistant|>\nA1<|endoftext|>\n<|user|>\nU2\n"},
  };
  const chat_msg conv[] = {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *out = NULL;
    assert_int_equal(chat_format(cases[i].t, conv, 4, false, &out), MOLE_OK);
    if (strcmp(out, cases[i].want) != 0)
      fail_msg("%s:\nwant: [%s]\ngot:  [%s]", chat_template_name(cases[i].t), cases[i].want, out);
    mole_free(out);
  }
  // the server's example (llama.cpp prints it for DeepSeek-R1 at start-up)
  const chat_msg ex[] = {
      {"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", "Hi there"}, {"user", "How are you?"}};
  char *out = NULL;
  assert_int_equal(chat_format(CHAT_TMPL_DEEPSEEK3, ex, 4, true, &out), MOLE_OK);
  assert_string_equal(out, "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜>"
                           "<｜User｜>How are you?<｜Assistant｜>");
  mole_free(out);
  // no messages: just the assistant prompt
  assert_int_equal(chat_format(CHAT_TMPL_CHATML, NULL, 0, true, &out), MOLE_OK);
  assert_string_equal(out, "<|im_start|>assistant\n");
  mole_free(out);
  assert_int_equal(chat_format(CHAT_TMPL_LLAMA3, NULL, 0, false, &out), MOLE_OK);
  assert_string_equal(out, "");
  mole_free(out);
}

static void test_format_errors(void **st) {
  (void)st;
  char *out = (char *)1;
  const chat_msg bad[] = {{"user", "hi"}, {"tool", "x"}};
  assert_int_equal(chat_format(CHAT_TMPL_CHATML, bad, 2, true, &out), MOLE_ERR_ARG);
  assert_null(out);
  assert_non_null(strstr(mole_last_error(), "\"tool\""));
  assert_non_null(strstr(mole_last_error(), "message 1"));
  const chat_msg nul[] = {{"user", NULL}};
  assert_int_equal(chat_format(CHAT_TMPL_CHATML, nul, 1, true, &out), MOLE_ERR_ARG);
  const chat_msg ok[] = {{"user", "hi"}};
  assert_int_equal(chat_format(CHAT_TMPL_UNKNOWN, ok, 1, true, &out), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "--template"));
  assert_int_equal(chat_format((chat_tmpl)999, ok, 1, true, &out), MOLE_ERR_ARG);
  assert_int_equal(chat_format(CHAT_TMPL_CHATML, ok, -1, true, &out), MOLE_ERR_ARG);
}

static char *read_template(const char *name) {
  char rel[256];
  snprintf(rel, sizeof(rel), "tests/data/chat/%s.jinja", name);
  size_t n = 0;
  char *raw = tu_read_file(tu_path(rel), &n);
  if (!raw) fail_msg("cannot read %s", tu_path(rel));
  char *s = malloc(n + 1);
  memcpy(s, raw, n);
  s[n] = '\0';
  free(raw);
  return s;
}

static void test_detect_real_templates(void **st) {
  (void)st;
  static const struct {
    const char *file;
    chat_tmpl t;
  } cases[] = {
      {"mixtral-8x7b-instruct-v0.1-orig", CHAT_TMPL_LLAMA2},
      {"mixtral-8x7b-instruct-v0.1", CHAT_TMPL_MISTRAL_V1},
      {"qwen2", CHAT_TMPL_CHATML},
      {"qwen3", CHAT_TMPL_QWEN3},
      {"qwen3.5", CHAT_TMPL_QWEN35},
      {"deepseek-v3", CHAT_TMPL_DEEPSEEK3},
      {"llama3", CHAT_TMPL_LLAMA3},
      {"deepseek-v2", CHAT_TMPL_DEEPSEEK2},
      {"deepseek-r1", CHAT_TMPL_DEEPSEEK3},
      {"olmoe-1b-7b-0924-instruct", CHAT_TMPL_TULU},
      {"zephyr", CHAT_TMPL_ZEPHYR},
      {"gpt-oss", CHAT_TMPL_GPT_OSS},
      {"glm-4.6", CHAT_TMPL_GLM45},
      {"glm-4.7-flash", CHAT_TMPL_GLM47},
      {"gemma-4", CHAT_TMPL_GEMMA4},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *tmpl = read_template(cases[i].file);
    chat_tmpl got = chat_template_detect(tmpl);
    if (got != cases[i].t)
      fail_msg("%s: detected %s, want %s", cases[i].file, chat_template_name(got), chat_template_name(cases[i].t));
    free(tmpl);
  }
}

static void test_detect_llama_cpp_strings(void **st) {
  (void)st;
  static const struct {
    const char *tmpl;
    chat_tmpl t;
  } cases[] = {
      // TheBloke/FusionNet_34Bx2_MoE-AWQ
      {"{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' -%}\n{%- if idx > 1 "
       "-%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n{%- else -%}\n{{- "
       "messages[idx]['content'] + ' [/INST]' -}}\n{%- endif -%}\n{% elif messages[idx]['role'] == 'system' %}\n{{- "
       "'[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['role'] == "
       "'assistant' -%}\n{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n{% endfor %}",
       CHAT_TMPL_LLAMA2_SYS_BOS},
      // bofenghuang/vigogne-2-70b-chat (excerpt: its [INST] and strip parts)
      {"{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
       "'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% endif %}",
       CHAT_TMPL_LLAMA2_SYS_STRIP},
      // mistralai/Mistral-Large-Instruct-2411
      {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
       "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
       "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
       "message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are "
       "supported!') }}{% endif %}{% endfor %}",
       CHAT_TMPL_MISTRAL_V7},
      // deepseek-coder-33b-instruct (excerpt)
      {"{%- if message['role'] == 'user' %}\n{{'### Instruction:\\n' + message['content'] + '\\n'}}\n{%- else "
       "%}\n{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}",
       CHAT_TMPL_DEEPSEEK},
      // teknium/OpenHermes-2.5-Mistral-7B
      {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
       "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
       CHAT_TMPL_CHATML},
      // families llama.cpp knows that are not rendered here: never mistaken for another
      {"{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for "
       "message in messages %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' "
       "}}{% endfor %}",
       CHAT_TMPL_UNKNOWN},  // gemma
      {"{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' }}"
       "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
       CHAT_TMPL_UNKNOWN},  // phi-3
      {"{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] }}{% elif "
       "item['role'] == 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] == 'assistant' "
       "%}<|assistant|>\n{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
       CHAT_TMPL_UNKNOWN},  // glmedge
      {"{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
       "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}",
       CHAT_TMPL_UNKNOWN},  // phi-4
      {"INVALID TEMPLATE", CHAT_TMPL_UNKNOWN},
      {"", CHAT_TMPL_UNKNOWN},
      // a bare name works as a template, as in llama.cpp
      {"chatml", CHAT_TMPL_CHATML},
      {"deepseek3", CHAT_TMPL_DEEPSEEK3},
      {"mistral", CHAT_TMPL_LLAMA2},
      {"harmony", CHAT_TMPL_GPT_OSS},
      {"gpt-oss", CHAT_TMPL_GPT_OSS},
      {"glm4.7", CHAT_TMPL_GLM47},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    chat_tmpl got = chat_template_detect(cases[i].tmpl);
    if (got != cases[i].t)
      fail_msg("case %zu: detected %s, want %s", i, chat_template_name(got), chat_template_name(cases[i].t));
  }
  assert_int_equal(chat_template_detect(NULL), CHAT_TMPL_UNKNOWN);
}

static void test_names(void **st) {
  (void)st;
  for (int t = 1; t < CHAT_TMPL_COUNT; t++) {
    const char *name = chat_template_name((chat_tmpl)t);
    assert_int_equal(chat_template_from_name(name), t);
    assert_non_null(strstr(chat_template_list(), name));
  }
  assert_int_equal(chat_template_from_name("mistral"), CHAT_TMPL_LLAMA2);
  assert_int_equal(chat_template_from_name("olmoe"), CHAT_TMPL_TULU);
  assert_int_equal(chat_template_from_name("qwen3"), CHAT_TMPL_QWEN3);
  assert_int_equal(chat_template_from_name("qwen2"), CHAT_TMPL_CHATML);
  assert_int_equal(chat_template_from_name("harmony"), CHAT_TMPL_GPT_OSS);
  assert_int_equal(chat_template_from_name("glm4.6"), CHAT_TMPL_GLM45);
  assert_int_equal(chat_template_from_name("gemma"), CHAT_TMPL_UNKNOWN);
  assert_int_equal(chat_template_from_name(NULL), CHAT_TMPL_UNKNOWN);
  assert_string_equal(chat_template_name(CHAT_TMPL_UNKNOWN), "unknown");
  assert_string_equal(chat_template_name((chat_tmpl)-3), "unknown");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format_families),
      cmocka_unit_test(test_format_no_prompt),
      cmocka_unit_test(test_format_errors),
      cmocka_unit_test(test_detect_real_templates),
      cmocka_unit_test(test_detect_llama_cpp_strings),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
