/* The OTLP span encoder's spans (see _encode_c.c): a usual step record's root and phase
 * spans written field by field into one buffer, each made a ScopeSpans.spans field; any
 * other record is NOT_HERE, left to the Python encoder before a byte is made. */
#include "_encode_c.h"

/* The attribute names and fixed fields, set once by configure() (_encode_c.c). */
PyObject *k_step, *k_phase, *k_kind, *k_loader, *k_slow, *k_timing;
PyObject *kind_internal, *unset_local;
PyObject *sixty_four;  /* the shift to a trace id's high half */

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

#define TRY(expr) do { int r_ = (expr); if (r_ <= 0) return r_; } while (0)

/* The span in b appended to out as a ScopeSpans.spans field: DONE, or FAILED (an error set). */
static int
append_span_field(Buf *b, PyObject *out)
{
    PyObject *field = enc_span_field(b);
    if (field == NULL || PyList_Append(out, field) < 0) {
        Py_XDECREF(field);
        return FAILED;
    }
    Py_DECREF(field);
    return DONE;
}


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
    return enc_put_kv(b, k_step, st->step);
}

/* One usual phase span into b (empty); NOT_HERE for any other phase. */
static int
encode_phase(Buf *b, const Step *st, PyObject *phase, uint64_t span_id, uint64_t parent)
{
    PyObject **f = PySequence_Fast_ITEMS(phase);
    uint64_t start, end;
    if (!enc_as_u64(f[P_START], &start) || !enc_as_u64(f[P_END], &end) || !start || !end
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
    TRY(enc_put_name(b, f[P_NAME]));
    if (put_times_and_head(b, st, start, end) <= 0) {
        return PyErr_Occurred() ? FAILED : NOT_HERE;
    }
    TRY(enc_put_kv(b, k_phase, f[P_NAME]));
    TRY(enc_put_kv(b, k_kind, f[P_KIND]));
    if (f[P_LOADER] != Py_None) {
        TRY(enc_put_kv(b, k_loader, f[P_LOADER]));
    }
    if (has_extra) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(extra, &pos, &k, &v)) {
            TRY(enc_put_kv(b, k, v));
        }
    }
    return put_bytes_obj(b, unset_local) < 0 ? FAILED : DONE;
}

/* 1 if `a` == `b`, else 0 (an error is cleared: a 0, and the record goes to Python). */
int
enc_same(PyObject *a, PyObject *b)
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
    if (r[C_STATUS] != Py_None || truth(r[C_EVENTS]) != 0 || !enc_as_u64(r[C_START], &start)
        || !enc_as_u64(r[C_END], &end) || !start || !end || is_constant(st, k_slow)) {
        return NOT_HERE;
    }
    /* Its attributes: the step, the loader (if any), the slow flag, then the step's own,
     * none of those named like a run constant. */
    Py_ssize_t pos = 0, i;
    PyObject *k, *v, *loader = NULL, *slow = NULL;
    if (!PyDict_Next(attrs, &pos, &k, &v) || !enc_same(k, k_step)
        || !PyDict_Next(attrs, &pos, &k, &v)) {
        return NOT_HERE;
    }
    if (enc_same(k, k_loader)) {
        loader = v;
        if (!PyDict_Next(attrs, &pos, &k, &v)) {
            return NOT_HERE;
        }
    }
    if (!enc_same(k, k_slow)) {
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
    TRY(enc_put_name(b, r[C_NAME]));
    if (put_times_and_head(b, st, start, end) <= 0) {
        return PyErr_Occurred() ? FAILED : NOT_HERE;
    }
    pos = 0;
    i = 0;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        if (i++ > 0) {  /* all but the step, in their order */
            TRY(enc_put_kv(b, k, v));
        }
    }
    return put_bytes_obj(b, unset_local) < 0 ? FAILED : DONE;
}

/* The record's spans, appended to `out`: DONE, NOT_HERE or FAILED. */
int
enc_record(Buf *b, PyObject *rec, PyObject *const *span_ids, Py_ssize_t n_ids, PyObject *out,
           Step *st)
{
    PyObject **r = &PyTuple_GET_ITEM(rec, 0);
    uint64_t root_id, ids[MAX_PHASES], ends[MAX_PHASES];
    Py_ssize_t order[MAX_PHASES];
    if (!PyDict_CheckExact(r[C_ATTRS]) || !enc_as_u64(r[C_ROOT_ID], &root_id)) {
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
    int fits = enc_as_u64(hi, &st->tid_hi);  /* over 128 bits: to_bytes raises, in Python */
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
            || !enc_as_u64(PySequence_Fast_ITEMS(ph[i])[P_END], &ends[i])
            || !enc_as_u64(span_ids[i], &ids[i])) {
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
        if (!enc_as_u64(parent_ref, &ref)) {
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
Step
enc_run_step(PyObject *block, PyObject *keys)
{
    Step st = {0, 0, block, keys, NULL, 1};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(k_timing); i++) {
        if (is_constant(&st, PyTuple_GET_ITEM(k_timing, i))) {
            st.timing_fast = 0;
        }
    }
    return st;
}
