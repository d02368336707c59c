/* The OpenAI Responses API, stateless: POST /v1/responses. A Responses request is converted into
 * the equivalent chat completions body (input items -> messages, Responses tools -> chat tools,
 * reasoning.effort -> enable_thinking), which then goes through the chat path's validation and
 * job building (api.c); the chat deltas that tl_gen produces (reasoning, content, tool calls) are
 * mapped onto output items (reasoning, message, function_call) and, when streaming, onto the
 * response.* events. Nothing is stored: previous_response_id and store=true get a 400.
 * docs/architecture.md §6 lists which fields are supported, ignored or refused. */
#ifndef TL_SERVER_RESPONSES_H
#define TL_SERVER_RESPONSES_H

#include <jansson.h>
#include "server/openai.h"
#include "server/server.h"

/* The chat completions body equivalent to the Responses request body (a JSON object). Returns a
 * new reference, or NULL with e filled (a 400 naming the Responses field). */
json_t *tl_resp_to_chat(json_t *body, tl_oai_error *e);

/* POST /v1/responses (same contract as tl_api_chat). */
int tl_api_responses(tl_server *s, const char *body, size_t len, int fd, tl_reply *out);

#endif
