/* Model output -> OpenAI message parts: reasoning_content, content and tool_calls, for Qwen3.6
 * (docs/model.md §4.4). One incremental parser serves both the streaming and the whole-text case:
 * tl_parse_text() is tl_parser_feed(whole text) + tl_parser_finish(), so a stream fed in any
 * pieces yields exactly the whole-text result (tests/cpu/test_parse.c checks every split point).
 *
 * What the parser recognises (the template's own shapes, docs/architecture.md §6.3):
 *
 *   [reasoning] </think> [content] <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n
 *   ...</function>\n</tool_call> [\n<tool_call>...]
 *
 * Reasoning (opts.thinking = 1: the generation prompt already opened <think>):
 *   - everything before the first "</think>" is reasoning; with no "</think>" at all the whole
 *     output is reasoning (the model was cut off while thinking);
 *   - leading "\n"s are dropped, then a leading "<think>" (a model that reopens it) and the
 *     "\n"s after it; trailing "\n"s before "</think>" (or the end) are dropped, and leading
 *     "\n"s after "</think>" are dropped from the content (the template's own split, line 95).
 * With opts.thinking = 0 everything is content; "</think>" is plain text.
 *
 * Content and tool calls (opts.parse_tools = 1; with 0, content is the text verbatim):
 *   - a call starts at "<tool_call>", optional whitespace, "<function=NAME>" where NAME is
 *     1..TL_PARSE_MAX_NAME bytes without '<', '>', CR, LF or NUL. Until that header is complete
 *     the parser holds the text back; a "<tool_call>" not followed by a valid header (or cut
 *     off by the end of the output) is ordinary content, byte for byte.
 *   - once the header is complete the call is committed (TL_PARSE_TOOL_START with its name).
 *     Parameters are "<parameter=KEY>" VALUE, VALUE ending at "</parameter>", or (leniently,
 *     as vLLM's qwen3_coder parser) at the next "<parameter=", "</function>" or "</tool_call>";
 *     one leading and one trailing "\n" of VALUE are dropped. Text between parameters is
 *     ignored. The call ends at "</tool_call>" (or "</function>" followed by a new
 *     "<tool_call>", or the end of the output: an unfinished call is closed with the
 *     parameters seen so far, its last value as far as it got).
 *   - arguments are a JSON object text exactly as Python's json.dumps(dict,
 *     ensure_ascii=False) writes it ({"k": "v", "n": 5}), keys in output order. Values are
 *     typed from the tool's JSON schema (opts.tools: OpenAI tools array; the parameter's
 *     "type" in function.parameters.properties), following vLLM's qwen3_coder parser:
 *       "null" (any case)                        -> null, whatever the type
 *       string/str/text/varchar/char/enum, unknown parameter, no schema -> string
 *       int*, uint*, long*, short*, unsigned*    -> integer if the text is one (int64), else
 *                                                   string
 *       num*, float*                             -> number (integral values within int64 as
 *                                                   integers, as vLLM does), else string
 *       boolean/bool/binary                      -> true/false if the text is one, else string
 *       object/array/arr/dict* / list* and others  -> the JSON value if the text parses, else
 *                                                   string
 *     A type list (["string","null"]) counts as string if it names a string type, else as its
 *     first non-null member. String values stream as they are generated; typed values arrive
 *     in one delta when the value ends.
 *   - content text around calls: whitespace right before a "<tool_call>" is dropped; after the
 *     first call, whitespace-only text between or after calls is dropped, and any other text is
 *     content (its leading whitespace dropped).
 *
 * Streaming guarantees: no event ever carries text that could still turn out to be part of a
 * tag ("</think>", "<tool_call>", ...): a possible partial tag at the end of the text seen so
 * far is held back until the next feed or tl_parser_finish. Every output string is valid
 * UTF-8: invalid input bytes become U+FFFD (as Python's errors="replace"), and an incomplete
 * UTF-8 sequence at the end of a piece waits for the next piece.
 *
 * Usage (server, per detokenized piece):
 *
 *   tl_parse_opts o; tl_parse_opts_default(&o); o.thinking = req->enable_thinking;
 *   o.parse_tools = req->n_tools > 0 && req->tool_choice != TL_TOOL_NONE; o.tools = req->tools;
 *   o.id_seed = <random per request>;
 *   tl_parser *p = tl_parser_new(&o);
 *   for each piece: n = tl_parser_feed(p, text, len, &ev); send ev[0..n-1];
 *   at the end:     n = tl_parser_finish(p, &ev);        send ev[0..n-1];
 *   const tl_parse_result *r = tl_parser_result(p);     (usage, finish_reason "tool_calls")
 *   tl_parser_free(p);
 */
#ifndef TL_TOKENIZER_PARSE_H
#define TL_TOKENIZER_PARSE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define TL_PARSE_MAX_NAME 256 /* bytes in a function or parameter name */

typedef struct tl_parse_opts {
    int thinking;        /* 1 (default): output starts inside reasoning */
    int parse_tools;     /* 1 (default): parse <tool_call> blocks; 0: they are content */
    const json_t *tools; /* borrowed OpenAI tools array for typing values; NULL: strings */
    uint64_t id_seed;    /* tool call ids: "call_" + 24 hex digits from (id_seed, index) */
} tl_parse_opts;

void tl_parse_opts_default(tl_parse_opts *o);

/* How a tool-call parameter's value text is typed from its property schema prop (NULL: an
 * undeclared parameter), as described above: TL_PVAL_STR keeps the text (except "null"), the
 * others convert it when it is one of theirs. Shared with src/grammar/toolcall.c, which
 * constrains the text so that it converts. */
enum { TL_PVAL_STR = 0, TL_PVAL_INT, TL_PVAL_NUM, TL_PVAL_BOOL, TL_PVAL_JSON };
int tl_parse_value_type(const json_t *prop);

typedef enum tl_parse_event_kind {
    TL_PARSE_REASONING = 1, /* text: a reasoning_content delta */
    TL_PARSE_CONTENT,       /* text: a content delta */
    TL_PARSE_TOOL_START,    /* index, id, text = the whole function name */
    TL_PARSE_TOOL_ARGS,     /* index, text: an arguments delta (concatenated: the JSON object) */
    TL_PARSE_TOOL_END,      /* index: the call's arguments are complete */
} tl_parse_event_kind;

/* One event. text is NUL-terminated UTF-8 (len bytes); text and id stay valid until the next
 * tl_parser_feed / tl_parser_finish / tl_parser_free on the same parser. Consecutive deltas of
 * one kind from one feed are merged into one event. */
typedef struct tl_parse_event {
    tl_parse_event_kind kind;
    int index;      /* tool call index, 0-based, for TL_PARSE_TOOL_* */
    const char *id; /* TL_PARSE_TOOL_START: "call_..." */
    const char *text;
    size_t len;
} tl_parse_event;

typedef struct tl_parse_tool_call {
    char *id;
    char *name;
    char *arguments; /* JSON object text */
} tl_parse_tool_call;

/* The accumulated message. Strings are NUL-terminated and never NULL ("" when empty). */
typedef struct tl_parse_result {
    char *reasoning;
    size_t reasoning_len;
    char *content;
    size_t content_len;
    tl_parse_tool_call *calls;
    int n_calls;
} tl_parse_result;

typedef struct tl_parser tl_parser;

/* Returns a new parser (opts NULL = defaults); tools is borrowed and must outlive it. */
tl_parser *tl_parser_new(const tl_parse_opts *opts);
void tl_parser_free(tl_parser *p);

/* Feeds the next piece of generated text (any split, even mid-character). Returns the number
 * of events (>= 0) and points *ev at them; never fails (allocation failure aborts, as xmalloc). */
int tl_parser_feed(tl_parser *p, const char *text, size_t len, const tl_parse_event **ev);

/* Ends the output: flushes held-back text and closes an unfinished call. Further feeds are
 * ignored. Returns the number of events, as tl_parser_feed. */
int tl_parser_finish(tl_parser *p, const tl_parse_event **ev);

/* Everything emitted so far, accumulated (the whole message after tl_parser_finish). */
const tl_parse_result *tl_parser_result(const tl_parser *p);

/* Whole-text parse into *out (free with tl_parse_result_free). Equals feeding text in any
 * pieces and accumulating the events. */
void tl_parse_text(const char *text, size_t len, const tl_parse_opts *opts, tl_parse_result *out);
void tl_parse_result_free(tl_parse_result *r);

/* The OpenAI assistant message for r: {"role":"assistant","content":...,"reasoning_content":
 * ...,"tool_calls":[{"id","type":"function","function":{"name","arguments"}}]}. content is
 * null when empty and there are tool calls; reasoning_content and tool_calls are left out when
 * empty. New reference. */
json_t *tl_parse_result_message(const tl_parse_result *r);

#endif
