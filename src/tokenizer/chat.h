/* The Qwen3.6 chat template (the chat_template.jinja the checkpoint ships, docs/model.md §4.4)
 * written out in C: OpenAI-style messages (+ tools) -> the prompt text, byte-identical to what
 * Hugging Face's apply_chat_template renders with jinja2 (ImmutableSandboxedEnvironment,
 * trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)). tests/py/test_chat.py
 * compares the two over a generated + hand-written corpus.
 *
 * One deliberate pre-processing step, the one servers (vLLM) do before applying the template:
 * a tool call whose "arguments" is a JSON string is parsed into the object it encodes (the
 * template iterates arguments|items, which fails on a string). A string that is not valid
 * JSON is an error.
 *
 * Also here, because the parser (parse.c) writes arguments the same way: Python's
 * json.dumps(value, ensure_ascii=False) with its default separators (", ", ": ").
 */
#ifndef TL_TOKENIZER_CHAT_H
#define TL_TOKENIZER_CHAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "common/buf.h"

typedef struct tl_chat_opts {
    int enable_thinking;       /* 1 (default); 0 = the template's enable_thinking=false */
    int preserve_thinking;     /* 0 (default); 1 = keep <think> blocks of every assistant turn */
    int add_generation_prompt; /* 1 (default): end with "<|im_start|>assistant\n<think>\n" */
} tl_chat_opts;

void tl_chat_opts_default(tl_chat_opts *o);

/* Renders messages (a JSON array of message objects) and tools (NULL when the request has
 * none; otherwise what the template receives as `tools`). On success *out is a malloc'd
 * NUL-terminated string of *out_len bytes (it may contain NUL bytes if the messages do).
 * Errors: TL_ERR_INVALID with err = the template's own message where the template raises one
 * ("No user query found in messages.", "System message must be at the beginning.",
 * "Unexpected message role.", ...), or a description of the type error jinja2 would raise;
 * *out is NULL then. */
int tl_chat_render(const json_t *messages, const json_t *tools, const tl_chat_opts *o, char **out,
                   size_t *out_len, char *err, size_t errlen);

/* Bytes of the generation prompt that tl_chat_render appends last with o (NULL: the defaults),
 * 0 when o->add_generation_prompt is off. The render of the same messages without it is the
 * render with it less that many bytes at the end: callers that need both (the prefix cache's
 * snapshot point) render once. */
size_t tl_chat_gen_prompt_len(const tl_chat_opts *o);

/* The prefix cache's snapshot point of a chat prompt (docs/architecture.md §4.1): text (len
 * bytes, rendered with o) was tokenized with tok into ids[0, n_ids); the result is the token
 * count of the render without the generation prompt (text less its last tl_chat_gen_prompt_len
 * bytes), the end of the last complete message, when those tokens are a proper prefix of ids;
 * else 0. The next turn re-renders this turn's answer differently from what was generated
 * (earlier turns lose their reasoning), so that is the longest prefix it is sure to share. */
struct tl_tokenizer;
int tl_chat_snap_point(const struct tl_tokenizer *tok, const tl_chat_opts *o, const char *text,
                       size_t len, const int32_t *ids, size_t n_ids);

/* The template's `s|trim`, Python's str.strip() on n bytes of UTF-8: *off and *len receive the
 * span left once leading and trailing Unicode whitespace (str.isspace()) is removed ({0, 0} for
 * all-space text). A byte of an invalid or truncated sequence counts as a non-space character.
 * Reads only the whitespace at both ends. */
void tl_chat_py_strip(const char *s, size_t n, size_t *off, size_t *len);

/* The writers below append to a tl_buf (common/buf.h); running out of memory leaves its
 * sticky error set (they never exit). */
/* Appends Python's json.dumps(v, ensure_ascii=False) of a jansson value. */
void tl_chat_json_dump(tl_buf *b, const json_t *v);
/* Appends the body of a JSON string literal (no quotes) as json.dumps escapes it: \" \\ \b \f
 * \n \r \t, other bytes < 0x20 as \u00XX, everything else verbatim. */
void tl_chat_json_escape(tl_buf *b, const char *s, size_t n);
/* Appends Python's repr() of a finite double (shortest round-trip digits, "1e+16", "0.0001"). */
void tl_chat_py_float(tl_buf *b, double x);

#endif
