/* safetensors: read-only views of Hugging Face safetensors checkpoints, and a writer.
 *
 * A file is an 8-byte little-endian header length, a JSON header mapping tensor names to
 * {dtype, shape, data_offsets} (plus an optional "__metadata__" object of string pairs), then the
 * data area. Files are mapped read-only with mmap; every tensor's data points into the mapping, so
 * tensors (and their names) live exactly as long as the safetensors_t they came from. A sharded
 * checkpoint (model.safetensors.index.json) opens as one merged view over all its shards. Every
 * header is validated completely at open time (dtype, shape, offsets that tile the data area
 * exactly, sizes checked for overflow), so a successful open never yields a tensor that reaches
 * outside its file. An open safetensors_t is immutable: any number of threads may read it at once;
 * open and close belong to one thread.
 */
#ifndef PD_SAFETENSORS_H
#define PD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#define SAFETENSORS_MAX_DIMS 8

typedef struct {
    const char *name;
    pd_dtype_t dtype;
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data; /* points into the mapped file (read-only) */
    size_t nbytes;    /* == product(shape) * pd_dtype_size(dtype) */
} safetensors_tensor_t;

typedef struct safetensors safetensors_t;

/* Maps and validates one safetensors file. Returns PD_OK and writes *st_p; PD_ERR_IO when the file
 * cannot be opened, read or mapped; PD_ERR_FORMAT for any malformed header or data layout (each
 * logged once naming the file and the field); PD_ERR_NOMEM. On failure nothing stays open and
 * *st_p is untouched. */
pd_status_t safetensors_open(const char *path, safetensors_t **st_p);

/* Opens the checkpoint in dir: every shard named in dir/model.safetensors.index.json's weight_map
 * (one merged view; each tensor must be in the shard the index names, no tensor in two shards) when
 * the index exists, else dir/model.safetensors. Returns PD_OK and writes *st_p; PD_ERR_IO (missing
 * or unreadable file, including a missing shard); PD_ERR_FORMAT (malformed index or shard, tensor
 * in two shards or in a shard other than the index says); PD_ERR_NOT_FOUND (a tensor listed in the
 * index is absent from its shard); PD_ERR_NOMEM. On failure nothing stays open. */
pd_status_t safetensors_open_model(const char *dir, safetensors_t **st_p);

/* Parses and validates a safetensors image in buf[0..len), which the caller keeps alive and
 * unchanged until safetensors_close. name (NULL: "<memory>") is used in messages. Returns as
 * safetensors_open, without PD_ERR_IO. */
pd_status_t safetensors_open_memory(const void *buf, size_t len, const char *name,
                                    safetensors_t **st_p);

/* Unmaps and frees st; every tensor pointer obtained from it becomes invalid. NULL is ignored. */
void safetensors_close(safetensors_t *st);

/* Number of tensors (all shards). */
size_t safetensors_count(const safetensors_t *st);

/* Tensor i (0 <= i < count; NULL otherwise), in data order within each shard, shards in index
 * order. */
const safetensors_tensor_t *safetensors_at(const safetensors_t *st, size_t i);

/* Tensor called name, or NULL if absent (O(log n)). Logs nothing. */
const safetensors_tensor_t *safetensors_find(const safetensors_t *st, const char *name);

/* The "__metadata__" string value for key (first shard that has it), or NULL. */
const char *safetensors_metadata(const safetensors_t *st, const char *key);

/* Looks up name and checks its dtype and shape (n_dims and every extent; shape may be NULL when
 * n_dims is 0). Returns PD_OK and writes *t_p; PD_ERR_NOT_FOUND when missing; PD_ERR_FORMAT when
 * the dtype or shape differs. Each failure logs one error naming the file, the tensor and expected
 * vs found, e.g. "model.safetensors: tensor model.norm.weight: shape [512] != expected [1024]".
 * *t_p is untouched on failure. */
pd_status_t safetensors_get(const safetensors_t *st, const char *name, pd_dtype_t dtype, int n_dims,
                            const int64_t *shape, const safetensors_tensor_t **t_p);

/* Writes tensors[0..n) to path as a safetensors file: the JSON header (with an "__metadata__"
 * object when n_meta_pairs > 0, meta[2k] = key, meta[2k+1] = value), padded with spaces so the
 * data area starts 8-byte aligned, then each tensor's nbytes from t->data, in the given order.
 * Writes path.tmp and renames it over path. Returns PD_OK; PD_ERR_INVALID for a bad argument
 * (NULL/empty/duplicate/reserved name, bad dtype, n_dims outside 0..8, negative extent, nbytes that
 * does not match the shape); PD_ERR_IO on a write failure; PD_ERR_NOMEM. On failure path is
 * unchanged and path.tmp removed. */
pd_status_t safetensors_write(const char *path, const safetensors_tensor_t *tensors, size_t n,
                              const char *const *meta, size_t n_meta_pairs);

#endif
