/* tokenizer: Hugging Face tokenizer.json byte-level BPE (Llama-3 / Qwen style) and tiktoken files
 * (Kimi K2's tiktoken.model), encode and decode.
 *
 * Supported pipeline, as the tokenizers library runs it: added tokens (special or not, with
 * lstrip/rstrip/single_word/normalized) split out first, longest match; normalizer null, NFC, NFD,
 * NFKC, NFKD or a Sequence of them (utf8proc); pre_tokenizer Split (regex or string pattern read
 * from the file, run with PCRE2 in UTF+UCP mode, every behavior, invert), ByteLevel
 * (add_prefix_space, use_regex with the GPT-2 pattern) or a Sequence of them; model BPE (merges in
 * both spellings, ignore_merges, unk_token, byte_fallback); post_processor TemplateProcessing,
 * ByteLevel, Roberta/Bert, Sequence or null; decoder ByteLevel or null. Anything else is refused at
 * load with PD_ERR_UNSUPPORTED.
 *
 * A tokenizer_t is immutable after load: any number of threads may encode and decode with the same
 * one at once. The caller owns it and destroys it after its last use. A tokenizer_stream_t belongs
 * to one request (one thread at a time) and must be destroyed before its tokenizer.
 */
#ifndef PD_TOKENIZER_H
#define PD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct tokenizer tokenizer_t;
typedef struct tokenizer_stream tokenizer_stream_t;

/* Loads a tokenizer.json file into *tok_p.
 * Returns PD_OK; PD_ERR_IO if the file cannot be read; PD_ERR_FORMAT for malformed JSON or an
 * inconsistent vocabulary/merges; PD_ERR_UNSUPPORTED for a component type this module does not
 * implement; PD_ERR_NOMEM. On failure *tok_p is untouched and nothing is leaked. */
pd_status_t tokenizer_load(const char *path, tokenizer_t **tok_p);

/* As tokenizer_load, from the len bytes of json in memory; name (may be NULL) labels log messages.
 * Returns the same codes as tokenizer_load except PD_ERR_IO. */
pd_status_t tokenizer_load_buffer(const char *json, size_t len, const char *name,
                                  tokenizer_t **tok_p);

/* Loads a tiktoken BPE as Kimi K2 publishes it: model (model_len bytes, the tiktoken.model file)
 * has one "<base64 token bytes> <rank>" line per token (the rank is the id; every byte must be a
 * token); config (may be NULL) is tokenizer_config.json, whose added_tokens_decoder names the
 * special ids n_base .. n_base + 257 (the rest are "<|reserved_token_ID|>"; n_base = max rank + 1),
 * as tokenization_kimi.py's TikTokenTokenizer builds them. Encoding is tiktoken's with
 * allowed_special="all": special tokens are split out first, the rest is cut by the
 * TikTokenTokenizer.pat_str of tokenization_kimi.py (Han runs, then words, 1-3 digit numbers,
 * punctuation, whitespace) and each piece is merged lowest-rank-pair first (a piece that is a token
 * is that token). No BOS is added (tokenizer_bos_id: -1). Decoding joins the tokens' bytes.
 * Returns as tokenizer_load_buffer. */
pd_status_t tokenizer_load_tiktoken_buffer(const char *model, size_t model_len,
                                           const char *config, size_t config_len, const char *name,
                                           tokenizer_t **tok_p);

/* As tokenizer_load_tiktoken_buffer from files (config_path may be NULL); PD_ERR_IO when a file
 * cannot be read. */
pd_status_t tokenizer_load_tiktoken(const char *model_path, const char *config_path,
                                    tokenizer_t **tok_p);

/* The tokenizer of a model directory: tokenizer.json when present, else tiktoken.model (with
 * tokenizer_config.json when present), as Kimi K2 ships it. PD_ERR_IO when it has neither. */
pd_status_t tokenizer_load_dir(const char *dir, tokenizer_t **tok_p);

/* Frees tok and everything it owns. NULL is accepted. */
void tokenizer_destroy(tokenizer_t *tok);

/* Encodes len bytes of UTF-8 text into token ids; add_special adds the post-processor's special
 * tokens (BOS). *ids_p is malloc'd (the caller frees it), *n_p is its length. Empty text gives zero
 * ids (plus the special tokens when add_special; *ids_p is then a valid pointer to free).
 * Returns PD_OK; PD_ERR_INVALID for invalid UTF-8 (the message gives the byte offset); PD_ERR_NOMEM;
 * PD_ERR_RESOURCE when the regex engine runs out of its match limits. On failure the outputs are
 * untouched. */
pd_status_t tokenizer_encode(const tokenizer_t *tok, const char *text, size_t len, bool add_special,
                             int32_t **ids_p, size_t *n_p);

/* Decodes n ids to UTF-8 (invalid byte sequences become U+FFFD, one per maximal invalid subpart, as
 * the tokenizers library does); skip_special drops special tokens. *text_p is malloc'd and
 * NUL-terminated, *len_p its length without the NUL.
 * Returns PD_OK; PD_ERR_INVALID for an id outside the vocabulary; PD_ERR_NOMEM. On failure the
 * outputs are untouched. */
pd_status_t tokenizer_decode(const tokenizer_t *tok, const int32_t *ids, size_t n,
                             bool skip_special, char **text_p, size_t *len_p);

/* Returns max id + 1 over the vocabulary and the added tokens. */
size_t tokenizer_vocab_size(const tokenizer_t *tok);

/* Returns the id of token (added tokens first, then the model vocabulary), -1 if absent. */
int32_t tokenizer_token_to_id(const tokenizer_t *tok, const char *token);

/* Returns the token string of id (owned by tok, valid until it is destroyed), NULL if absent. */
const char *tokenizer_id_to_token(const tokenizer_t *tok, int32_t id);

/* Returns true if id is an added token marked special. */
bool tokenizer_is_special(const tokenizer_t *tok, int32_t id);

/* Returns the first special id the post-processor puts before the text (BOS), -1 if none. */
int32_t tokenizer_bos_id(const tokenizer_t *tok);

/* Creates a streaming detokenizer over tok into *s_p; skip_special drops special tokens.
 * Returns PD_OK or PD_ERR_NOMEM (then *s_p is untouched). */
pd_status_t tokenizer_stream_create(const tokenizer_t *tok, bool skip_special,
                                    tokenizer_stream_t **s_p);

/* Frees s. NULL is accepted. */
void tokenizer_stream_destroy(tokenizer_stream_t *s);

/* Appends id and writes into *delta_p (malloc'd, NUL-terminated, possibly empty) the text that is
 * now complete, *len_p its length; an incomplete UTF-8 sequence at the end is held back until a
 * later token completes it. The concatenation of all deltas and the final flush equals
 * tokenizer_decode of all ids.
 * Returns PD_OK; PD_ERR_INVALID for an id outside the vocabulary (the stream is unchanged);
 * PD_ERR_NOMEM (the stream is unchanged). On failure the outputs are untouched. */
pd_status_t tokenizer_stream_push(tokenizer_stream_t *s, int32_t id, char **delta_p,
                                  size_t *len_p);

/* Writes into *delta_p whatever is held back (an incomplete sequence becomes U+FFFD) and resets the
 * stream for reuse. Returns PD_OK or PD_ERR_NOMEM (the stream is unchanged). */
pd_status_t tokenizer_stream_flush(tokenizer_stream_t *s, char **delta_p, size_t *len_p);

/* Returns true if the len bytes of text are valid UTF-8 (no overlongs, surrogates or code points
 * above U+10FFFF). Otherwise writes the offset of the first bad byte to *bad_offset_p (may be NULL)
 * and returns false. */
bool tokenizer_utf8_valid(const char *text, size_t len, size_t *bad_offset_p);

#endif
