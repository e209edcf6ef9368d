/* The OTLP span encoder's protobuf wire primitives, shared by the span encoder and the
 * request join (_encode_c.c): a growable buffer and the varint, fixed and bytes fields
 * written into it (inline here: every field of every span goes through them), and, in
 * _encode_c_wire.c, a KeyValue attribute, a span's name, and a buffered span made a
 * ScopeSpans.spans field. Byte for byte the Python encoder's (encoding.py;
 * tests/export/otlp/test_encode_c.py). */
#ifndef OTEL_TRAIN_ENCODE_C_H
#define OTEL_TRAIN_ENCODE_C_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *p;
    size_t len, cap;
    char local[4096];
} Buf;

static inline int
buf_reserve(Buf *b, size_t more)
{
    if (b->len + more <= b->cap) {
        return 0;
    }
    size_t cap = b->cap * 2;
    while (cap < b->len + more) {
        cap *= 2;
    }
    char *p = b->p == b->local ? PyMem_Malloc(cap) : PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->p == b->local) {
        memcpy(p, b->local, b->len);
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int
put(Buf *b, const void *src, size_t n)
{
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline size_t
varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline size_t
varint_to(char *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[n++] = (char)v;
    return n;
}

static inline int
put_varint(Buf *b, uint64_t v)
{
    if (buf_reserve(b, 10) < 0) {
        return -1;
    }
    b->len += varint_to(b->p + b->len, v);
    return 0;
}

/* A tag and 8 bytes: an id big endian (as the SDK writes ids), a time little endian. */
static inline int
put_fixed(Buf *b, const char *tag, size_t tag_len, uint64_t v, int big_endian)
{
    if (buf_reserve(b, tag_len + 8) < 0) {
        return -1;
    }
    char *o = b->p + b->len;
    memcpy(o, tag, tag_len);
    for (int i = 0; i < 8; i++) {
        o[tag_len + i] = (char)(v >> (big_endian ? 56 - 8 * i : 8 * i));
    }
    b->len += tag_len + 8;
    return 0;
}

static inline int
put_bytes_obj(Buf *b, PyObject *bytes)
{
    return put(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
}

/* 1 and *out for a Python int in 0..2**64-1, 0 for anything else (no error left set). */
int enc_as_u64(PyObject *o, uint64_t *out);
/* A KeyValue attribute (key, value) as the Python encoder writes it. */
int enc_put_kv(Buf *b, PyObject *key, PyObject *value);
/* A span's name field. */
int enc_put_name(Buf *b, PyObject *name);
/* The span in b as a ScopeSpans.spans field (a new bytes object), or NULL. */
PyObject * enc_span_field(Buf *b);

/* A record's and a phase's positions (records/span_rows.py C_* and the phase tuple). */
enum { C_NAME, C_TRACE, C_ROOT_ID, C_FLAGS, C_START, C_END, C_ATTRS, C_STATUS, C_EVENTS,
       C_PHASES, C_IDS, C_LEN };
enum { P_NAME, P_KIND, P_LOADER, P_DURATION, P_ORDINAL, P_PARENT, P_START, P_END, P_STATUS,
       P_EVENTS, P_EXTRA, P_DEVICE, P_LEN };
#define MAX_PHASES 256

/* The attribute names and fixed fields, set once by configure() (defined in
 * _encode_c_span.c). */
extern PyObject *k_step, *k_phase, *k_kind, *k_loader, *k_slow, *k_timing;
extern PyObject *kind_internal, *unset_local;
extern PyObject *sixty_four;  /* the shift to a trace id's high half */

#define NOT_HERE 0  /* encode() results: leave the record to Python */
#define DONE 1
#define FAILED (-1)

/* A run's encoding state: the step's trace id halves, the run constants' fields and names,
 * the step attribute's value, and whether the timing attributes take the fast path. */
typedef struct {
    uint64_t tid_hi, tid_lo;
    PyObject *block;      /* the run constants' attribute fields */
    PyObject *keys;       /* their names (a frozenset) */
    PyObject *step;       /* the step attribute's value */
    int timing_fast;      /* no run constant is named like a timing attribute */
} Step;

/* The record's spans, appended to `out`: DONE, NOT_HERE or FAILED (_encode_c_span.c). */
int enc_record(Buf *b, PyObject *rec, PyObject *const *span_ids, Py_ssize_t n_ids,
               PyObject *out, Step *st);
/* A run's encoding state from its constants' fields and names. */
Step enc_run_step(PyObject *block, PyObject *keys);
/* 1 if `a` == `b`, else 0 (an error is cleared). */
int enc_same(PyObject *a, PyObject *b);

#endif
