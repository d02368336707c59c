/* Anthropic Messages API (POST /v1/messages, POST /v1/messages/count_tokens): the request is
 * converted into the OpenAI chat request that openai.c validates (messages + tools -> chat
 * template -> job, as /v1/chat/completions), and the generated stream (reasoning, content, tool
 * calls from gen.c) into Anthropic content blocks and SSE events. Errors travel in Anthropic's
 * shape {"type":"error","error":{"type","message"}}. The conversions are pure functions over
 * jansson values (unit-tested in tests/cpu/test_anthropic.c); the endpoints run on
 * libmicrohttpd's connection threads like api.c's. */
#ifndef TL_SERVER_ANTHROPIC_H
#define TL_SERVER_ANTHROPIC_H

#include <jansson.h>
#include <stddef.h>
#include "server/openai.h"
#include "server/server.h"

/* An Anthropic request object -> a new OpenAI chat request object (*out). count_only: a
 * count_tokens body (no max_tokens, no sampling fields). Fields that would change the output
 * and are not supported fail with the field named; fields that do not are dropped. */
int tl_ant_to_oai(json_t *in, int count_only, json_t **out, tl_oai_error *e);

/* An OpenAI assistant message (as tl_gen_message builds it) -> Anthropic content blocks
 * (thinking, text, tool_use with the arguments parsed into "input"). New reference. */
json_t *tl_ant_blocks(const json_t *msg);

/* stop_reason for an OpenAI finish_reason; stop_seq: a stop sequence matched. */
const char *tl_ant_stop_reason(const char *finish_reason, int stop_seq);

/* Anthropic error type for an HTTP status ("invalid_request_error", "not_found_error", ...). */
const char *tl_ant_error_type(int http);
/* {"type":"error","error":{"type","message"}} as a malloc'd compact JSON string. */
char *tl_ant_error_json(const tl_oai_error *e);

/* ---- endpoints (fd: the client socket; return 0, or -1 when the client went away) ---- */
int tl_ant_messages(tl_server *s, const char *body, size_t len, int fd, tl_reply *out);
void tl_ant_count_tokens(tl_server *s, const char *body, size_t len, tl_reply *out);
/* An Anthropic-shaped error reply. */
void tl_ant_error_reply(tl_reply *out, const tl_oai_error *e);

struct tl_ant_stream;
/* As tl_stream_read/tl_stream_free, for an Anthropic event stream. */
long tl_ant_stream_read(struct tl_ant_stream *st, char *buf, size_t max);
void tl_ant_stream_free(struct tl_ant_stream *st);

#endif
