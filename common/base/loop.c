#include "loop.h"

#include <pthread.h>
#include <stdlib.h>

#include "log.h"

typedef struct loop__item {
    struct loop__item *next;
    void (*fn)(void *arg);
    void *arg;
} loop__item_t;

struct loop_post {
    uv_async_t async;
    pthread_mutex_t mu;
    loop__item_t *head, *tail;
};

static void loop__drain(uv_async_t *async)
{
    loop_post_t *post = async->data;
    loop__item_t *it;

    pthread_mutex_lock(&post->mu);
    it = post->head;
    post->head = post->tail = NULL;
    pthread_mutex_unlock(&post->mu);
    while (it) {
        loop__item_t *next = it->next;
        it->fn(it->arg);
        free(it);
        it = next;
    }
}

pd_status_t loop_post_create(uv_loop_t *loop, loop_post_t **post_p)
{
    loop_post_t *post = calloc(1, sizeof *post);
    int rc;

    if (!post) {
        pd_log_error("loop post: out of memory");
        return PD_ERR_NOMEM;
    }
    pthread_mutex_init(&post->mu, NULL);
    rc = uv_async_init(loop, &post->async, loop__drain);
    if (rc < 0) {
        pd_log_error("loop post: uv_async_init: %s", uv_strerror(rc));
        goto err_free_post;
    }
    post->async.data = post;
    *post_p = post;
    return PD_OK;

err_free_post:
    pthread_mutex_destroy(&post->mu);
    free(post);
    return PD_ERR_INTERNAL;
}

pd_status_t loop_post(loop_post_t *post, void (*fn)(void *arg), void *arg)
{
    loop__item_t *it = malloc(sizeof *it);

    PD_ASSERT(fn != NULL);
    if (!it) {
        pd_log_error("loop post: out of memory");
        return PD_ERR_NOMEM;
    }
    it->next = NULL;
    it->fn = fn;
    it->arg = arg;
    pthread_mutex_lock(&post->mu);
    if (post->tail)
        post->tail->next = it;
    else
        post->head = it;
    post->tail = it;
    pthread_mutex_unlock(&post->mu);
    uv_async_send(&post->async);
    return PD_OK;
}

static void loop__closed(uv_handle_t *h)
{
    loop_post_t *post = h->data;
    loop__item_t *it = post->head;

    while (it) {
        loop__item_t *next = it->next;
        free(it);
        it = next;
    }
    pthread_mutex_destroy(&post->mu);
    free(post);
}

void loop_post_destroy(loop_post_t *post)
{
    if (!post)
        return;
    /* items posted but not yet run (the loop stopped first): run them now, so that nothing a
     * producer handed over is lost or leaked */
    loop__drain(&post->async);
    uv_close((uv_handle_t *)&post->async, loop__closed);
}
