/* A ring step's trace id (identity.step_trace_id) hashed from C through hashlib's blake2b
 * object: the run id's part fed once (`head`), copied and fed each step's digits, so a
 * run's ids cost no Python frame a step (_recorder_c_ringrows.c reads them). */
#include "_recorder_c.h"

static PyObject *rows_s_copy, *rows_s_update, *rows_s_digest;

/* The trace id of step `index` (an exact int within 64 bits), identity.step_trace_id's
 * blake2b(f"{run_id}\x00{step}", digest_size=16): `head`, hashlib's blake2b object fed the
 * run id's part, copied and fed the step's digits (hashlib's own C, without a Python frame
 * a step). NULL with no error set when `index` is no such int (the caller's Python
 * computes it). */

PyObject *
otr_ring_trace_id_index(PyObject *head, PyObject *index)
{
    if (!PyLong_CheckExact(index)) {
        return NULL;
    }
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return NULL;
    }
    return otr_ring_trace_id_of(head, value);
}

/* int.from_bytes(d[:16], "big") or 1 (0 is the invalid trace id): one int made where
 * CPython's _PyLong_FromByteArray is there (3.8 to 3.13), else of its two halves. */
static PyObject *
trace_id_from_digest(const unsigned char *d)
{
    uint64_t hi = 0, lo = 0;
    for (int i = 0; i < 8; i++) {
        hi = (hi << 8) | d[i];
        lo = (lo << 8) | d[8 + i];
    }
    if (hi == 0 && lo == 0) {
        return PyLong_FromLong(1);
    }
#if PY_VERSION_HEX >= 0x03080000 && PY_VERSION_HEX < 0x030E0000
    return _PyLong_FromByteArray(d, 16, 0, 0);  /* big-endian, unsigned */
#else
    PyObject *high = PyLong_FromUnsignedLongLong(hi), *low = NULL, *shift = NULL,
             *shifted = NULL, *out = NULL;
    if (high != NULL && (low = PyLong_FromUnsignedLongLong(lo)) != NULL
        && (shift = PyLong_FromLong(64)) != NULL
        && (shifted = PyNumber_Lshift(high, shift)) != NULL) {
        out = PyNumber_Or(shifted, low);
    }
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(shift);
    Py_XDECREF(shifted);
    return out;
#endif
}

/* The decimal digits of `value` (as "%lld" writes them) at the end of `buf` (24 bytes):
 * their start. */
static char *
decimal_digits(long long value, char *buf)
{
    char *p = buf + 24;
    unsigned long long u = value < 0 ? 0ULL - (unsigned long long)value
                                     : (unsigned long long)value;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0) {
        *--p = '-';
    }
    return p;
}

/* The hash type's copy, update and digest, looked up on the type once (not on each object
 * a step: three method lookups a trace id), for the type of the last head seen; and the
 * bytearray the step's digits are written into for update (one, not a bytes a step: update
 * reads it at once, under the GIL). */
static PyObject *hash_type, *hash_copy, *hash_update, *hash_digest, *hash_digits;

static int
hash_methods(PyObject *head)
{
    PyObject *type = (PyObject *)Py_TYPE(head);
    if (type == hash_type) {
        return 0;
    }
    if (rows_s_digest == NULL
        && ((rows_s_copy = PyUnicode_InternFromString("copy")) == NULL
            || (rows_s_update = PyUnicode_InternFromString("update")) == NULL
            || (rows_s_digest = PyUnicode_InternFromString("digest")) == NULL)) {
        return -1;
    }
    if (hash_digits == NULL && (hash_digits = PyByteArray_FromStringAndSize(NULL, 24)) == NULL) {
        return -1;
    }
    PyObject *c = PyObject_GetAttr(type, rows_s_copy);
    PyObject *u = c ? PyObject_GetAttr(type, rows_s_update) : NULL;
    PyObject *d = u ? PyObject_GetAttr(type, rows_s_digest) : NULL;
    if (d == NULL) {
        Py_XDECREF(c);
        Py_XDECREF(u);
        return -1;
    }
    Py_INCREF(type);
    Py_XSETREF(hash_type, type);
    Py_XSETREF(hash_copy, c);
    Py_XSETREF(hash_update, u);
    Py_XSETREF(hash_digest, d);
    return 0;
}

/* ring_trace_id of step `value` (NULL: an error is set): type(head).copy(head), its
 * update(digits) and digest(), called as the type's functions with the object first (a
 * copy of another type: its own methods). */
PyObject *
otr_ring_trace_id_of(PyObject *head, long long value)
{
    if (hash_methods(head) < 0) {
        return NULL;
    }
    char text[24];
    char *digits = decimal_digits(value, text);
    PyObject *hash = PyObject_Vectorcall(hash_copy, &head, 1, NULL), *tail = NULL, *r = NULL,
             *digest = NULL, *out = NULL;
    Py_ssize_t n = text + 24 - digits;
    if (hash != NULL && PyByteArray_Resize(hash_digits, n) == 0) {
        memcpy(PyByteArray_AS_STRING(hash_digits), digits, (size_t)n);
        tail = hash_digits;
        Py_INCREF(tail);
        if ((PyObject *)Py_TYPE(hash) == hash_type) {
            PyObject *args[2] = {hash, tail};
            if ((r = PyObject_Vectorcall(hash_update, args, 2, NULL)) != NULL) {
                digest = PyObject_Vectorcall(hash_digest, args, 1, NULL);
            }
        }
        else if ((r = PyObject_CallMethodOneArg(hash, rows_s_update, tail)) != NULL) {
            digest = PyObject_CallMethodNoArgs(hash, rows_s_digest);
        }
    }
    if (digest != NULL) {
        if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != 16) {
            PyErr_SetString(PyExc_ValueError, "ring_trace_id: a 16-byte blake2b is needed");
        }
        else {
            out = trace_id_from_digest((const unsigned char *)PyBytes_AS_STRING(digest));
        }
    }
    Py_XDECREF(hash);
    Py_XDECREF(tail);
    Py_XDECREF(r);
    Py_XDECREF(digest);
    return out;
}

/* ring_trace_id(head, index) -> int | None: head (hashlib.blake2b of the run id's part,
 * digest_size=16) fed str(index), as step_trace_id reads it; None for an index that is no
 * int within 64 bits. */
PyObject *
otr_ring_trace_id(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ring_trace_id(head, index)");
        return NULL;
    }
    PyObject *out = otr_ring_trace_id_index(args[0], args[1]);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}
