/* The grammar vocabulary of a tl_tokenizer (src/grammar/vocab_tok.c): each token's decoded
 * bytes, added tokens excluded. */
#include <stdlib.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "tokenizer/bpe.h"

int tl_grammar_vocab_from_tokenizer(const struct tl_tokenizer *tok, tl_grammar_vocab **out) {
    *out = NULL;
    int n = tl_tokenizer_n_vocab(tok);
    if (n <= 0) return TL_ERR_INVALID;
    const char **bytes = calloc((size_t)n, sizeof(*bytes));
    size_t *lens = calloc((size_t)n, sizeof(*lens));
    int rc = bytes && lens ? 0 : TL_ERR_NOMEM;
    for (int i = 0; i < n && !rc; i++)
        if (!tl_token_is_added(tok, i)) bytes[i] = tl_token_str(tok, i, &lens[i]);
    if (!rc) rc = tl_grammar_vocab_new(bytes, lens, n, out);
    free(bytes);
    free(lens);
    return rc;
}
