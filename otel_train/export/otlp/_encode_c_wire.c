/* The OTLP span encoder's attribute, name and span-field writers (see _encode_c.h). */
#include "_encode_c.h"

/* 1 and *out for a Python int in 0..2**64-1, 0 for anything else (no error left set). */
int
enc_as_u64(PyObject *o, uint64_t *out)
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
int
enc_put_kv(Buf *b, PyObject *key, PyObject *value)
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
            if (!enc_as_u64(value, &u)) {
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
int
enc_put_name(Buf *b, PyObject *name)
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
PyObject *
enc_span_field(Buf *b)
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
