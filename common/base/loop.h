/* loop: hand work from any thread to a libuv loop thread.
 *
 * A loop_post_t owns one uv_async_t and a mutex-protected FIFO of (fn, arg) items. loop_post() may
 * be called from any thread (compute threads hand results back this way); every fn then runs on
 * the loop thread, in posting order, from the loop's async callback. The loop thread creates and
 * destroys the object; items still queued at destroy are dropped without running (their args are
 * the poster's to free), so stop the posting threads first.
 */
#ifndef PD_LOOP_H
#define PD_LOOP_H

#include <uv.h>

#include "status.h"

typedef struct loop_post loop_post_t;

/* Creates a poster bound to loop (loop thread only). Returns PD_OK, PD_ERR_NOMEM, or
 * PD_ERR_INTERNAL when uv_async_init fails; nothing is allocated on failure. The poster keeps the
 * loop alive (an active handle) until loop_post_destroy. */
pd_status_t loop_post_create(uv_loop_t *loop, loop_post_t **post_p);

/* Queues fn(arg) to run on the loop thread; any thread. Returns PD_OK or PD_ERR_NOMEM (nothing
 * queued). fn must not be NULL. */
pd_status_t loop_post(loop_post_t *post, void (*fn)(void *arg), void *arg);

/* Runs the items still queued (call it once every producer thread has stopped, while the state
 * the items refer to still exists: nothing handed over is lost or leaked), then closes the async
 * handle (the memory is freed once the loop processes the close); loop thread only. Accepts
 * NULL. */
void loop_post_destroy(loop_post_t *post);

#endif
