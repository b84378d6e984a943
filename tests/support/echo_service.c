#include "echo_service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "testsvc.pb-c.h"

struct echo_service {
    pd_grpc_server_t *srv;
    pd_grpc_health_t *health;
    pd_grpc_method_fn handlers[4];
    int64_t cancels, calls, last_deadline_ms;
    char last_md[64];
    uv_loop_t *loop;
};

/* One in-progress Unary (sleeping) or Stream call. */
typedef struct {
    echo_service_t *es;
    pd_grpc_call_t *call; /* NULL once finished */
    uv_timer_t timer;
    int is_stream;
    int remaining, seq, payload_size, delay_ms, error_code;
    char *error_message, *text;
    uint8_t *payload;
    size_t payload_len;
} echo_state_t;

static void echo__state_closed(uv_handle_t *h)
{
    echo_state_t *s = h->data;
    free(s->error_message);
    free(s->text);
    free(s->payload);
    free(s);
}

static void echo__state_end(echo_state_t *s, int code, const char *msg)
{
    if (s->call)
        pd_grpc_call_finish(s->call, code, msg);
    s->call = NULL;
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, echo__state_closed);
}

static void echo__on_cancel(pd_grpc_call_t *call, void *arg)
{
    echo_state_t *s = arg;
    (void)call;
    s->es->cancels++;
    echo__state_end(s, PD_GRPC_CANCELLED, NULL);
}

static void echo__stream_step(echo_state_t *s);

static void echo__on_timer(uv_timer_t *t)
{
    echo_state_t *s = t->data;

    if (!s->is_stream) {
        Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
        rep.text = s->text;
        rep.payload.data = s->payload;
        rep.payload.len = s->payload_len;
        if (s->error_code) {
            echo__state_end(s, s->error_code, s->error_message);
            return;
        }
        pd_status_t st = pd_grpc_call_send(s->call, &rep.base);
        echo__state_end(s, st == PD_OK ? 0 : pd_status_grpc_code(st), NULL);
        return;
    }
    echo__stream_step(s);
}

static void echo__on_writable(pd_grpc_call_t *call, void *arg)
{
    (void)call;
    echo__stream_step(arg);
}

static void echo__stream_step(echo_state_t *s)
{
    uint8_t *payload = calloc(1, (size_t)s->payload_size + 1);

    while (s->remaining > 0) {
        Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
        rep.seq = s->seq;
        rep.text = "stream";
        rep.payload.data = payload;
        rep.payload.len = payload ? (size_t)s->payload_size : 0;
        pd_status_t st = pd_grpc_call_send(s->call, &rep.base);
        if (st == PD_AGAIN)
            break; /* the writable callback resumes */
        if (st != PD_OK) {
            free(payload);
            echo__state_end(s, pd_status_grpc_code(st), pd_status_str(st));
            return;
        }
        s->seq++;
        s->remaining--;
        if (s->delay_ms > 0 && s->remaining > 0) {
            uv_timer_start(&s->timer, echo__on_timer, (uint64_t)s->delay_ms, 0);
            break;
        }
    }
    free(payload);
    if (s->remaining == 0)
        echo__state_end(s, s->error_code, s->error_message);
}

static echo_state_t *echo__state_new(echo_service_t *es, pd_grpc_call_t *call)
{
    echo_state_t *s = calloc(1, sizeof *s);

    if (!s)
        return NULL;
    s->es = es;
    s->call = call;
    uv_timer_init(es->loop, &s->timer);
    s->timer.data = s;
    pd_grpc_call_set_cancel_cb(call, echo__on_cancel, s);
    pd_grpc_call_set_writable_cb(call, echo__on_writable, s);
    return s;
}

static void echo__note_call(echo_service_t *es, pd_grpc_call_t *call)
{
    const char *md = pd_grpc_call_metadata(call, "x-test");
    es->calls++;
    es->last_deadline_ms = pd_grpc_call_deadline_ms(call);
    snprintf(es->last_md, sizeof es->last_md, "%s", md ? md : "");
}

static void echo__unary(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Pdtest__EchoRequest *r = (const void *)req;
    echo_service_t *es = user;
    echo_state_t *s;

    echo__note_call(es, call);
    if (r->sleep_ms <= 0) {
        Pdtest__EchoReply rep = PDTEST__ECHO_REPLY__INIT;
        if (r->error_code) {
            pd_grpc_call_finish(call, r->error_code, r->error_message);
            return;
        }
        rep.text = r->text;
        rep.payload = r->payload;
        pd_status_t st = pd_grpc_call_send(call, &rep.base);
        pd_grpc_call_finish_status(call, st, NULL);
        return;
    }
    s = echo__state_new(es, call);
    if (!s) {
        pd_grpc_call_finish(call, PD_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    s->text = strdup(r->text);
    s->error_code = r->error_code;
    s->error_message = strdup(r->error_message);
    if (r->payload.len) {
        s->payload = malloc(r->payload.len);
        if (s->payload)
            memcpy(s->payload, r->payload.data, r->payload.len);
        s->payload_len = s->payload ? r->payload.len : 0;
    }
    uv_timer_start(&s->timer, echo__on_timer, (uint64_t)r->sleep_ms, 0);
}

static void echo__stream(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Pdtest__StreamRequest *r = (const void *)req;
    echo_service_t *es = user;
    echo_state_t *s;

    echo__note_call(es, call);
    s = echo__state_new(es, call);
    if (!s) {
        pd_grpc_call_finish(call, PD_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    s->is_stream = 1;
    s->remaining = r->count;
    s->payload_size = r->payload_size > 0 ? r->payload_size : 0;
    s->delay_ms = r->delay_ms;
    s->error_code = r->error_code;
    s->error_message = strdup(r->error_message);
    if (r->sleep_ms > 0)
        uv_timer_start(&s->timer, echo__on_timer, (uint64_t)r->sleep_ms, 0);
    else
        echo__stream_step(s);
}

static void echo__stats(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    echo_service_t *es = user;
    Pdtest__StatsReply rep = PDTEST__STATS_REPLY__INIT;
    pd_grpc_server_stats_t st;
    (void)req;

    pd_grpc_server_stats(es->srv, &st);
    rep.cancels = es->cancels;
    rep.buffered_bytes = (int64_t)st.buffered_bytes;
    rep.active_calls = (int64_t)st.active_calls;
    rep.calls = es->calls;
    rep.last_deadline_ms = es->last_deadline_ms;
    rep.last_metadata = es->last_md;
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

static void echo__set_health(pd_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    const Pdtest__SetHealthRequest *r = (const void *)req;
    echo_service_t *es = user;
    Pdtest__StatsReply rep = PDTEST__STATS_REPLY__INIT;
    pd_status_t st;

    if (!es->health) {
        pd_grpc_call_finish(call, PD_GRPC_UNIMPLEMENTED, "no health service");
        return;
    }
    st = pd_grpc_health_set(es->health, r->service, r->status);
    if (st != PD_OK) {
        pd_grpc_call_finish_status(call, st, NULL);
        return;
    }
    pd_grpc_call_finish_status(call, pd_grpc_call_send(call, &rep.base), NULL);
}

pd_status_t echo_service_create(uv_loop_t *loop, pd_grpc_server_t *srv, pd_grpc_health_t *health,
                                echo_service_t **es_p)
{
    echo_service_t *es = calloc(1, sizeof *es);
    pd_status_t st;

    if (!es)
        return PD_ERR_NOMEM;
    es->srv = srv;
    es->loop = loop;
    es->health = health;
    es->last_deadline_ms = -1;
    es->handlers[0] = echo__unary;
    es->handlers[1] = echo__stream;
    es->handlers[2] = echo__stats;
    es->handlers[3] = echo__set_health;
    PD_ASSERT(pdtest__echo__descriptor.n_methods == 4);
    st = pd_grpc_server_add_service(srv, &pdtest__echo__descriptor, es->handlers, es);
    if (st != PD_OK) {
        free(es);
        return st;
    }
    *es_p = es;
    return PD_OK;
}

int64_t echo_service_cancels(const echo_service_t *es)
{
    return es->cancels;
}

void echo_service_destroy(echo_service_t *es)
{
    if (!es)
        return;
    free(es);
}
