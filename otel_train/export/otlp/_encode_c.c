/* step_fields: a step record's OTLP Span messages in C (twin: encoding._Encoder.record).
 *
 * The exporter process encodes every step record it receives to its spans' protobuf bytes
 * (ScopeSpans.spans fields) as the record arrives. In Python that is a tuple unpack, a few
 * cache lookups and a join per span; here it is one call per step that writes each span's
 * fields into one buffer and makes one bytes object per span. The output is byte for byte
 * the Python encoder's (tests/export/otlp/test_encode_c.py).
 *
 * Only the usual step is encoded here: phases with a start, an end and a parent, no
 * status, events or device time, whose own attributes are none or only their device timing
 * (booleans and strings); a root with its usual attributes (step, loader, slow flag) and
 * what the step added after them, as exact strings, booleans, 64-bit integers or floats;
 * no run constant named like any of them. Anything else returns None before a byte is
 * made, and the Python encoder encodes the record: the choice is per record, and the C
 * encoder never raises for a record's values (a conversion error is cleared and is a
 * None).
 *
 * Usage (encoding.py)::
 *
 *     configure(step, phase, kind, loader, slow, timing_keys, kind_internal, unset_local)
 *     fields = step_fields(rec, span_ids, constants_block, constant_keys)  # list or None
 *     body = request_body(resource, scope, fields, scope_tail, resource_tail)  # or None
 *     n = run_draws(recs, k)  # int or None
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A record's and a phase's positions (records/span_rows.py C_* and the phase tuple). */
enum { C_NAME, C_TRACE, C_ROOT_ID, C_FLAGS, C_START, C_END, C_ATTRS, C_STATUS, C_EVENTS,
       C_PHASES, C_IDS, C_LEN };
enum { P_NAME, P_KIND, P_LOADER, P_DURATION, P_ORDINAL, P_PARENT, P_START, P_END, P_STATUS,
       P_EVENTS, P_EXTRA, P_DEVICE, P_LEN };
#define MAX_PHASES 256

/* The attribute names and fixed fields, set once by configure(). */
static PyObject *k_step, *k_phase, *k_kind, *k_loader, *k_slow, *k_timing;
static PyObject *kind_internal, *unset_local;
static PyObject *sixty_four;  /* the shift to a trace id's high half */

typedef struct {
    char *p;
    size_t len, cap;
    char local[4096];
} Buf;

static int
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

static int
put(Buf *b, const void *src, size_t n)
{
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static size_t
varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t
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

static int
put_varint(Buf *b, uint64_t v)
{
    if (buf_reserve(b, 10) < 0) {
        return -1;
    }
    b->len += varint_to(b->p + b->len, v);
    return 0;
}

/* A tag and 8 bytes: an id big endian (as the SDK writes ids), a time little endian. */
static int
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

static int
put_bytes_obj(Buf *b, PyObject *bytes)
{
    return put(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
}

/* 1 and *out for a Python int in 0..2**64-1, 0 for anything else (no error left set). */
static int
as_u64(PyObject *o, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        return 0;
    }
    /* Below 2**63 (times, most ids) read digit by digit; PyLong_AsUnsignedLongLong goes
     * through a byte array, the most of this encoder's CPU when every field took it. */
    int overflow;
    long long small = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
        if (small == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (small < 0) {
            return 0;
        }
        *out = (uint64_t)small;
        return 1;
    }
    if (overflow < 0) {
        return 0;
    }
#if PY_VERSION_HEX < 0x030E0000
    /* 2**63 and over: exact when it needs at most 64 bits (read modulo 2**64 then). */
    if ((int64_t)_PyLong_NumBits(o) > 64) {
        PyErr_Clear();
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLongMask(o);
#else
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
#endif
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* A Span.attributes field (tag 9) of one key and value, as wire.key_value writes it:
 * 1 written, 0 a value this encoder leaves to Python, -1 an error (memory). */
static int
put_kv(Buf *b, PyObject *key, PyObject *value)
{
    Py_ssize_t klen, slen = 0;
    const char *k, *s = NULL;
    char val[10];
    size_t vlen;
    char vtag;
    /* Exact strings only: Python writes a str subclass through its own encode(). */
    if (!PyUnicode_CheckExact(key) || (k = PyUnicode_AsUTF8AndSize(key, &klen)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (PyBool_Check(value)) {
        vtag = 0x10;
        val[0] = value == Py_True ? 1 : 0;
        vlen = 1;
    }
    else if (PyUnicode_CheckExact(value)) {
        if ((s = PyUnicode_AsUTF8AndSize(value, &slen)) == NULL) {
            PyErr_Clear();
            return 0;
        }
        vtag = 0x0a;
        vlen = varint_len((uint64_t)slen) + (size_t)slen;
    }
    else if (PyLong_Check(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        uint64_t u;
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (overflow > 0) {  /* 2**63..2**64-1: written as it is */
            if (!as_u64(value, &u)) {
                return 0;
            }
        }
        else if (overflow < 0) {
            return 0;
        }
        else {
            u = (uint64_t)v;  /* negative: its 64-bit two's complement, as wire.varint */
        }
        vtag = 0x18;
        vlen = varint_to(val, u);
    }
    else if (PyFloat_Check(value)) {
        double d = PyFloat_AS_DOUBLE(value);
        uint64_t u;
        memcpy(&u, &d, 8);
        for (int i = 0; i < 8; i++) {
            val[i] = (char)(u >> (8 * i));
        }
        vtag = 0x21;
        vlen = 8;
    }
    else {
        return 0;
    }
    size_t any_len = 1 + vlen;  /* AnyValue: its tag and value */
    size_t kv_len = 1 + varint_len((uint64_t)klen) + (size_t)klen
                    + 1 + varint_len(any_len) + any_len;
    if (buf_reserve(b, 1 + 10 + kv_len) < 0) {
        return -1;
    }
    char *o = b->p + b->len;
    *o++ = 0x4a;
    o += varint_to(o, kv_len);
    *o++ = 0x0a;
    o += varint_to(o, (uint64_t)klen);
    memcpy(o, k, (size_t)klen);
    o += klen;
    *o++ = 0x12;
    o += varint_to(o, any_len);
    *o++ = vtag;
    if (s != NULL) {
        o += varint_to(o, (uint64_t)slen);
        memcpy(o, s, (size_t)slen);
        o += slen;
    }
    else {
        memcpy(o, val, vlen);
        o += vlen;
    }
    b->len = (size_t)(o - b->p);
    return 1;
}

/* The name field (tag 5): 1, 0 for a name that is not a usable string, -1 on error. */
static int
put_name(Buf *b, PyObject *name)
{
    Py_ssize_t n;
    const char *s;
    if (!PyUnicode_CheckExact(name) || (s = PyUnicode_AsUTF8AndSize(name, &n)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (n == 0) {
        return 0;
    }
    if (put(b, "\x2a", 1) < 0 || put_varint(b, (uint64_t)n) < 0 || put(b, s, (size_t)n) < 0) {
        return -1;
    }
    return 1;
}

/* The span's message in b as a ScopeSpans.spans field (tag 2, length, message). */
static PyObject *
span_field(Buf *b)
{
    char head[11];
    head[0] = 0x12;
    size_t h = 1 + varint_to(head + 1, b->len);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(h + b->len));
    if (out != NULL) {
        memcpy(PyBytes_AS_STRING(out), head, h);
        memcpy(PyBytes_AS_STRING(out) + h, b->p, b->len);
    }
    return out;
}

/* A timing attribute's value: exactly a bool or a str (as _Encoder._timing_bytes). */
static int
is_timing_key(PyObject *key)
{
    Py_ssize_t n = PyTuple_GET_SIZE(k_timing);
    for (Py_ssize_t i = 0; i < n; i++) {
        int eq = PyObject_RichCompareBool(key, PyTuple_GET_ITEM(k_timing, i), Py_EQ);
        if (eq != 0) {
            if (eq < 0) {
                PyErr_Clear();
                return 0;
            }
            return 1;
        }
    }
    return 0;
}

/* 1 if a truthy `o` is true, 0 if not; -1 (error cleared) when it cannot tell. */
static int
truth(PyObject *o)
{
    int t = PyObject_IsTrue(o);
    if (t < 0) {
        PyErr_Clear();
    }
    return t;
}

#define NOT_HERE 0  /* encode() results: leave the record to Python */
#define DONE 1
#define FAILED (-1)
#define TRY(expr) do { int r_ = (expr); if (r_ <= 0) return r_; } while (0)

/* The span in b appended to out as a ScopeSpans.spans field: DONE, or FAILED (an error set). */
static int
append_span_field(Buf *b, PyObject *out)
{
    PyObject *field = span_field(b);
    if (field == NULL || PyList_Append(out, field) < 0) {
        Py_XDECREF(field);
        return FAILED;
    }
    Py_DECREF(field);
    return DONE;
}

typedef struct {
    uint64_t tid_hi, tid_lo;
    PyObject *block;      /* the run constants' attribute fields */
    PyObject *keys;       /* their names (a frozenset) */
    PyObject *step;       /* the step attribute's value */
    int timing_fast;      /* no run constant is named like a timing attribute */
} Step;

/* The trace id, span id and (if any) parent id fields. */
static int
put_ids(Buf *b, const Step *st, uint64_t span_id, uint64_t parent)
{
    if (put_fixed(b, "\x0a\x10", 2, st->tid_hi, 1) < 0
        || put_fixed(b, "", 0, st->tid_lo, 1) < 0
        || put_fixed(b, "\x12\x08", 2, span_id, 1) < 0
        || (parent && put_fixed(b, "\x22\x08", 2, parent, 1) < 0)) {
        return -1;
    }
    return 1;
}

/* The kind and time fields, then the run constants and the step: every span's head. */
static int
put_times_and_head(Buf *b, const Step *st, uint64_t start, uint64_t end)
{
    if (put_bytes_obj(b, kind_internal) < 0 || put_fixed(b, "\x39", 1, start, 0) < 0
        || put_fixed(b, "\x41", 1, end, 0) < 0 || put_bytes_obj(b, st->block) < 0) {
        return -1;
    }
    return put_kv(b, k_step, st->step);
}

/* One usual phase span into b (empty); NOT_HERE for any other phase. */
static int
encode_phase(Buf *b, const Step *st, PyObject *phase, uint64_t span_id, uint64_t parent)
{
    PyObject **f = PySequence_Fast_ITEMS(phase);
    uint64_t start, end;
    if (!as_u64(f[P_START], &start) || !as_u64(f[P_END], &end) || !start || !end
        || !parent || f[P_DEVICE] != Py_None || f[P_STATUS] != Py_None
        || truth(f[P_EVENTS]) != 0) {
        return NOT_HERE;
    }
    PyObject *extra = f[P_EXTRA];
    int has_extra = truth(extra);
    if (has_extra < 0 || (has_extra && (!st->timing_fast || !PyDict_Check(extra)
                                        || PyDict_GET_SIZE(extra) > 2))) {
        return NOT_HERE;
    }
    if (has_extra) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(extra, &pos, &k, &v)) {
            if (!is_timing_key(k) || !(PyBool_Check(v) || PyUnicode_CheckExact(v))) {
                return NOT_HERE;
            }
        }
    }
    TRY(put_ids(b, st, span_id, parent));
    TRY(put_name(b, f[P_NAME]));
    if (put_times_and_head(b, st, start, end) <= 0) {
        return PyErr_Occurred() ? FAILED : NOT_HERE;
    }
    TRY(put_kv(b, k_phase, f[P_NAME]));
    TRY(put_kv(b, k_kind, f[P_KIND]));
    if (f[P_LOADER] != Py_None) {
        TRY(put_kv(b, k_loader, f[P_LOADER]));
    }
    if (has_extra) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(extra, &pos, &k, &v)) {
            TRY(put_kv(b, k, v));
        }
    }
    return put_bytes_obj(b, unset_local) < 0 ? FAILED : DONE;
}

/* 1 if `a` == `b`, else 0 (an error is cleared: a 0, and the record goes to Python). */
static int
same(PyObject *a, PyObject *b)
{
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0) {
        PyErr_Clear();
        return 0;
    }
    return eq;
}

/* 1 if `key` names a run constant, 0 if not (an error is a 1: the record goes to Python). */
static int
is_constant(const Step *st, PyObject *key)
{
    int in = PySet_Contains(st->keys, key);
    if (in < 0) {
        PyErr_Clear();
        return 1;
    }
    return in;
}

/* The usual root span into b (empty); NOT_HERE for any other root. */
static int
encode_root(Buf *b, const Step *st, PyObject *rec, uint64_t root_id)
{
    PyObject **r = &PyTuple_GET_ITEM(rec, 0);
    PyObject *attrs = r[C_ATTRS];
    uint64_t start, end;
    if (r[C_STATUS] != Py_None || truth(r[C_EVENTS]) != 0 || !as_u64(r[C_START], &start)
        || !as_u64(r[C_END], &end) || !start || !end || is_constant(st, k_slow)) {
        return NOT_HERE;
    }
    /* Its attributes: the step, the loader (if any), the slow flag, then the step's own,
     * none of those named like a run constant. */
    Py_ssize_t pos = 0, i;
    PyObject *k, *v, *loader = NULL, *slow = NULL;
    if (!PyDict_Next(attrs, &pos, &k, &v) || !same(k, k_step)
        || !PyDict_Next(attrs, &pos, &k, &v)) {
        return NOT_HERE;
    }
    if (same(k, k_loader)) {
        loader = v;
        if (!PyDict_Next(attrs, &pos, &k, &v)) {
            return NOT_HERE;
        }
    }
    if (!same(k, k_slow)) {
        return NOT_HERE;
    }
    slow = v;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        if (is_constant(st, k)) {
            return NOT_HERE;
        }
    }
    if (slow == NULL || !PyBool_Check(slow)
        || (loader != NULL && !PyUnicode_CheckExact(loader))) {
        return NOT_HERE;
    }
    TRY(put_ids(b, st, root_id, 0));
    TRY(put_name(b, r[C_NAME]));
    if (put_times_and_head(b, st, start, end) <= 0) {
        return PyErr_Occurred() ? FAILED : NOT_HERE;
    }
    pos = 0;
    i = 0;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        if (i++ > 0) {  /* all but the step, in their order */
            TRY(put_kv(b, k, v));
        }
    }
    return put_bytes_obj(b, unset_local) < 0 ? FAILED : DONE;
}

/* The record's spans, appended to `out`: DONE, NOT_HERE or FAILED. */
static int
encode(Buf *b, PyObject *rec, PyObject *const *span_ids, Py_ssize_t n_ids, PyObject *out,
       Step *st)
{
    PyObject **r = &PyTuple_GET_ITEM(rec, 0);
    uint64_t root_id, ids[MAX_PHASES], ends[MAX_PHASES];
    Py_ssize_t order[MAX_PHASES];
    if (!PyDict_CheckExact(r[C_ATTRS]) || !as_u64(r[C_ROOT_ID], &root_id)) {
        return NOT_HERE;
    }
    st->step = PyDict_GetItemWithError(r[C_ATTRS], k_step);
    if (st->step == NULL) {
        PyErr_Clear();
        return NOT_HERE;
    }
    /* The trace id: 16 bytes big endian (to_bytes(16, "big")); a negative one's high
     * half is negative, and goes to Python. */
    PyObject *tid = r[C_TRACE], *hi;
    if (!PyLong_Check(tid)) {
        return NOT_HERE;
    }
    st->tid_lo = PyLong_AsUnsignedLongLongMask(tid);
    if (st->tid_lo == (uint64_t)-1 && PyErr_Occurred()) {
        return FAILED;
    }
    hi = PyNumber_Rshift(tid, sixty_four);
    if (hi == NULL) {
        return FAILED;
    }
    int fits = as_u64(hi, &st->tid_hi);  /* over 128 bits: to_bytes raises, in Python */
    Py_DECREF(hi);
    if (!fits) {
        return NOT_HERE;
    }
    PyObject *phases = r[C_PHASES];
    if (!PyList_CheckExact(phases) && !PyTuple_CheckExact(phases)) {
        return NOT_HERE;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(phases);
    if (n > MAX_PHASES || n_ids != n) {
        return NOT_HERE;
    }
    PyObject **ph = PySequence_Fast_ITEMS(phases);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((!PyTuple_CheckExact(ph[i]) && !PyList_CheckExact(ph[i]))
            || PySequence_Fast_GET_SIZE(ph[i]) != P_LEN
            || !as_u64(PySequence_Fast_ITEMS(ph[i])[P_END], &ends[i])
            || !as_u64(span_ids[i], &ids[i])) {
            return NOT_HERE;
        }
        /* In the order the phases ended, ties in their order (span_rows.phase_end_order). */
        Py_ssize_t j = i;
        while (j > 0 && ends[order[j - 1]] > ends[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (Py_ssize_t o = 0; o < n; o++) {
        Py_ssize_t i = order[o];
        PyObject *parent_ref = PySequence_Fast_ITEMS(ph[i])[P_PARENT];
        uint64_t ref, parent;
        if (!as_u64(parent_ref, &ref)) {
            return NOT_HERE;
        }
        if (ref == root_id) {
            parent = root_id;
        }
        else if (ref >= 1 && ref <= (uint64_t)n) {
            parent = ids[ref - 1];
        }
        else {
            return NOT_HERE;
        }
        b->len = 0;
        int done = encode_phase(b, st, ph[i], ids[i], parent);
        if (done != DONE || append_span_field(b, out) != DONE) {
            return done != DONE ? done : FAILED;
        }
    }
    b->len = 0;
    int done = encode_root(b, st, rec, root_id);
    return done != DONE ? done : append_span_field(b, out);
}

/* A run's encoding state from its constants' fields and names. A run constant named like
 * the timing attributes (a run whose spans all share one timing): a phase's own timing
 * attributes follow the rows' rules (Python). */
static Step
run_step(PyObject *block, PyObject *keys)
{
    Step st = {0, 0, block, keys, NULL, 1};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(k_timing); i++) {
        if (is_constant(&st, PyTuple_GET_ITEM(k_timing, i))) {
            st.timing_fast = 0;
        }
    }
    return st;
}

/* An empty buffer on its local storage. */
static void
buf_init(Buf *b)
{
    b->p = b->local;
    b->len = 0;
    b->cap = sizeof(b->local);
}

static PyObject *
step_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_Check(args[2]) || !PyAnySet_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "step_fields(rec, span_ids, constants_block: bytes, constant_keys: set)");
        return NULL;
    }
    if (k_step == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "step_fields: configure() was not called");
        return NULL;
    }
    PyObject *rec = args[0], *span_ids = args[1];
    if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != C_LEN
        || !PyList_CheckExact(span_ids)) {
        Py_RETURN_NONE;
    }
    Step st = run_step(args[2], args[3]);
    Buf b;
    buf_init(&b);
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    int done = encode(&b, rec, ((PyListObject *)span_ids)->ob_item, PyList_GET_SIZE(span_ids),
                      out, &st);
    if (b.p != b.local) {
        PyMem_Free(b.p);
    }
    if (done == DONE) {
        return out;
    }
    Py_DECREF(out);
    if (done == FAILED) {
        return NULL;
    }
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* steps_fields(recs, start, ids, at, constants_block, constant_keys, out) -> (k, at):
 * from recs[start] on, each record's spans as step_fields writes them, appended to `out`,
 * its phases' span ids taken from ids[at:] in turn; stops at the first record it does not
 * encode (k, with `at` where its ids begin): one with no phases or ids of its own (it draws
 * none from `ids`), one whose ids `ids` runs out of, one this encoder leaves to Python, or
 * one that fails here (the Python encodes it, and reports its own error). One call a frame
 * of the usual steps (span_fields.encode_frame), not one a record. */
static PyObject *
steps_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyList_Check(args[0]) || !PyList_Check(args[2])
        || !PyBytes_Check(args[4]) || !PyAnySet_Check(args[5]) || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "steps_fields(recs: list, start, ids: list, at, constants_block: bytes, "
                        "constant_keys: set, out: list)");
        return NULL;
    }
    if (k_step == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "steps_fields: configure() was not called");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[1]), at = PyLong_AsSsize_t(args[3]);
    if ((k == -1 || at == -1) && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *recs = args[0], *ids = args[2], *out = args[6];
    Step st = run_step(args[4], args[5]);
    Buf b;
    buf_init(&b);
    int failed = 0;
    for (; k >= 0 && k < PyList_GET_SIZE(recs); k++) {
        PyObject *rec = PyList_GET_ITEM(recs, k);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != C_LEN) {
            break;
        }
        PyObject *phases = PyTuple_GET_ITEM(rec, C_PHASES), *own = PyTuple_GET_ITEM(rec, C_IDS);
        if ((!PyList_CheckExact(phases) && !PyTuple_CheckExact(phases)) || own != Py_None) {
            break;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(phases);
        if (n == 0 || at + n > PyList_GET_SIZE(ids)) {
            break;
        }
        Py_ssize_t before = PyList_GET_SIZE(out);
        /* The ids in place: `ids` is the caller's pool, which nothing encode() calls can
         * reach to change; the record is held meanwhile. */
        Py_INCREF(rec);
        int done = encode(&b, rec, ((PyListObject *)ids)->ob_item + at, n, out, &st);
        Py_DECREF(rec);
        if (done != DONE) {  /* its spans so far out again: the record is Python's */
            PyErr_Clear();
            if (PyList_SetSlice(out, before, PyList_GET_SIZE(out), NULL) < 0) {
                failed = 1;
            }
            break;
        }
        at += n;
    }
    if (b.p != b.local) {
        PyMem_Free(b.p);
    }
    if (failed) {
        return NULL;
    }
    return Py_BuildValue("(nn)", k, at);
}

/* run_draws(recs, k) -> int | None: the phase span ids the run of records from recs[k]
 * draws, up to the first record that draws none or its own (no phases, or ids handed to
 * user spans): span_fields._run_draws, the twin. None for a record of another shape on the
 * way (not a record tuple, phases not a list or tuple, ids neither None nor a dict): the
 * Python counts then. */
static PyObject *
run_draws(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "run_draws(recs: list, k: int)");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *recs = args[0];
    Py_ssize_t total = 0;
    for (k = k < 0 ? 0 : k; k < PyList_GET_SIZE(recs); k++) {
        PyObject *rec = PyList_GET_ITEM(recs, k);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != C_LEN) {
            Py_RETURN_NONE;
        }
        PyObject *phases = PyTuple_GET_ITEM(rec, C_PHASES), *ids = PyTuple_GET_ITEM(rec, C_IDS);
        if (phases == Py_None) {  /* an operation between steps: draws none */
            break;
        }
        if ((!PyList_CheckExact(phases) && !PyTuple_CheckExact(phases))
            || (ids != Py_None && !PyDict_CheckExact(ids))) {
            Py_RETURN_NONE;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(phases);
        if (n == 0 || (ids != Py_None && PyDict_GET_SIZE(ids) > 0)) {
            break;
        }
        total += n;
    }
    return PyLong_FromSsize_t(total);
}

/* request_body(resource, scope, fields, scope_tail, resource_tail) -> bytes | None:
 * the ExportTraceServiceRequest of one ResourceSpans (tag 1) with one ScopeSpans (tag 2):
 * the Resource field, then the ScopeSpans' scope field, its spans' fields and its tail (its
 * schema_url field, or empty), then the resource's tail; None when a field is not exactly
 * bytes (a user span of its own scope: encoding._Encoder.request groups those). The
 * Python twin is _Encoder._resource_spans: the same bytes, here summed and copied in one
 * pass into one bytes object. */
static PyObject *
request_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])
        || !PyList_Check(args[2]) || !PyBytes_Check(args[3]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "request_body(resource: bytes, scope: bytes, fields: list, "
                        "scope_tail: bytes, resource_tail: bytes)");
        return NULL;
    }
    PyObject *fields = args[2];
    Py_ssize_t n = PyList_GET_SIZE(fields);
    uint64_t spans = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(fields, i);
        if (!PyBytes_CheckExact(f)) {
            Py_RETURN_NONE;
        }
        spans += (uint64_t)PyBytes_GET_SIZE(f);
    }
    uint64_t res = (uint64_t)PyBytes_GET_SIZE(args[0]), sc = (uint64_t)PyBytes_GET_SIZE(args[1]);
    uint64_t sc_tail = (uint64_t)PyBytes_GET_SIZE(args[3]);
    uint64_t res_tail = (uint64_t)PyBytes_GET_SIZE(args[4]);
    uint64_t scope_len = sc + spans + sc_tail;  /* the ScopeSpans message */
    uint64_t rs_len = res + 1 + varint_len(scope_len) + scope_len + res_tail;
    uint64_t total = 1 + varint_len(rs_len) + rs_len;
    if (total > (uint64_t)PY_SSIZE_T_MAX) {
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) {
        return NULL;
    }
    char *o = PyBytes_AS_STRING(out);
    *o++ = 0x0a;
    o += varint_to(o, rs_len);
    memcpy(o, PyBytes_AS_STRING(args[0]), res);
    o += res;
    *o++ = 0x12;
    o += varint_to(o, scope_len);
    memcpy(o, PyBytes_AS_STRING(args[1]), sc);
    o += sc;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(fields, i);
        Py_ssize_t len = PyBytes_GET_SIZE(f);
        memcpy(o, PyBytes_AS_STRING(f), (size_t)len);
        o += len;
    }
    memcpy(o, PyBytes_AS_STRING(args[3]), sc_tail);
    o += sc_tail;
    memcpy(o, PyBytes_AS_STRING(args[4]), res_tail);
    return out;
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *step, *phase, *kind, *loader, *slow, *timing, *kind_bytes, *unset;
    if (!PyArg_ParseTuple(args, "UUUUUO!SS:configure", &step, &phase, &kind, &loader, &slow,
                          &PyTuple_Type, &timing, &kind_bytes, &unset)) {
        return NULL;
    }
    PyObject **slots[] = {&k_step, &k_phase, &k_kind, &k_loader, &k_slow, &k_timing,
                          &kind_internal, &unset_local};
    PyObject *values[] = {step, phase, kind, loader, slow, timing, kind_bytes, unset};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"step_fields", (PyCFunction)(void (*)(void))step_fields, METH_FASTCALL,
     "step_fields(rec, span_ids, constants_block, constant_keys) -> list[bytes] | None\n\n"
     "A step record's spans as ScopeSpans.spans fields, the bytes _Encoder.record makes;\n"
     "None for a record this encoder leaves to Python."},
    {"steps_fields", (PyCFunction)(void (*)(void))steps_fields, METH_FASTCALL,
     "steps_fields(recs, start, ids, at, constants_block, constant_keys, out) -> (k, at)\n\n"
     "Records' spans from recs[start] on, appended to out, their phase ids from ids[at:],\n"
     "up to the first record left to Python (its index, and where its ids begin)."},
    {"run_draws", (PyCFunction)(void (*)(void))run_draws, METH_FASTCALL,
     "run_draws(recs, k) -> int | None\n\n"
     "The phase span ids the run of records from recs[k] draws (None: the Python counts)."},
    {"request_body", (PyCFunction)(void (*)(void))request_body, METH_FASTCALL,
     "request_body(resource, scope, fields, scope_tail, resource_tail) -> bytes | None\n\n"
     "One ResourceSpans' request of spans of one scope, the bytes\n"
     "_Encoder._resource_spans joins; None when a field is not exactly bytes."},
    {"configure", configure, METH_VARARGS,
     "configure(step, phase, kind, loader, slow, timing_keys, kind_internal, unset_local)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode_c",
                                    "OTLP Span messages of a step record, in C.", -1, methods};

PyMODINIT_FUNC
PyInit__encode_c(void)
{
    if (sixty_four == NULL && (sixty_four = PyLong_FromLong(64)) == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
