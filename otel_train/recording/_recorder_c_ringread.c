/* ring_read_items: the step ring's consumer in C (twin: step_ring_reader.StepRingReader's
 * read loop, `_read_items_python`).
 *
 * The exporter process reads every ring record here: from the ring's bytes straight to the
 * objects the Python reader makes (a RingStep with its event list and root attributes, the
 * QUEUED marker in its place), the string and phase definitions kept in the reader's own
 * dicts (id -> str, id -> RingPhase), so the Python reader and this one can take turns on
 * the same ring. `head` is loaded with acquire, pairing with the C writer's release store
 * (_recorder_c_ring.c): the record's bytes are seen before it on any memory model. Every
 * record the layout defines is read here (step_ring.py's docstring holds it); a corrupt one
 * raises ValueError, an id never defined KeyError, as the Python reader does.
 */
#include "_recorder_c.h"
#include <stdint.h>
#include <string.h>

#define RR_HEADER_BYTES 256
#define RR_OFF_HEAD 64
#define RR_OFF_TAIL 128
enum { RR_PAD, RR_STRING, RR_PHASE, RR_STEP, RR_QUEUED };
enum { RR_ATTR_BOOL, RR_ATTR_INT, RR_ATTR_FLOAT, RR_ATTR_STR };

/* Little-endian loads (the layout's byte order; x86 and ARM Linux are little-endian). */
static inline uint64_t ld_u64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int64_t ld_i64(const char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t ld_u32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t ld_i32(const char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t ld_u16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* A borrowed reference to the definition `id` in `table` (KeyError when it has none). */
static PyObject *
rr_lookup(PyObject *table, long long id)
{
    PyObject *key = PyLong_FromLongLong(id);
    if (key == NULL) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(table, key);
    if (value == NULL && !PyErr_Occurred()) {
        PyErr_SetObject(PyExc_KeyError, key);
    }
    Py_DECREF(key);
    return value;
}

static PyObject *
rr_corrupt(uint64_t position)
{
    PyErr_Format(PyExc_ValueError, "step ring: corrupt record at %llu",
                 (unsigned long long)position);
    return NULL;
}

/* The RingStep of the STEP record whose body starts at `p` (`end`: its record's end). */
static PyObject *
rr_step(const char *p, const char *end, int count, PyObject *strings, PyObject *phases,
        PyObject *step_type, uint64_t position)
{
    if (end - p < 32 + 24 * (Py_ssize_t)count) {
        return rr_corrupt(position);
    }
    int64_t index = ld_i64(p), start_ns = ld_i64(p + 8), end_ns = ld_i64(p + 16);
    int32_t loader_id = ld_i32(p + 24);
    uint32_t n_attrs = ld_u32(p + 28);
    p += 32;
    PyObject *ev = PyList_New((Py_ssize_t)count * 4);
    PyObject *attrs = NULL, *args[6] = {NULL};
    PyObject *result = NULL;
    if (ev == NULL) {
        return NULL;
    }
    for (int i = 0; i < count; i++, p += 24) {
        PyObject *phase = rr_lookup(phases, ld_u32(p));
        if (phase == NULL) {
            goto done;
        }
        PyObject *start = PyLong_FromLongLong(ld_i64(p + 8));
        PyObject *stop = start ? PyLong_FromLongLong(ld_i64(p + 16)) : NULL;
        if (stop == NULL) {
            Py_XDECREF(start);
            goto done;
        }
        Py_INCREF(phase);
        PyList_SET_ITEM(ev, 4 * i, phase);
        PyList_SET_ITEM(ev, 4 * i + 1, start);
        PyList_SET_ITEM(ev, 4 * i + 2, stop);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(ev, 4 * i + 3, Py_None);
    }
    if (n_attrs) {
        if ((attrs = PyDict_New()) == NULL) {
            goto done;
        }
        for (uint32_t i = 0; i < n_attrs; i++) {
            if (end - p < 8) {
                rr_corrupt(position);
                goto done;
            }
            int32_t key_id = ld_i32(p);
            uint16_t kind = ld_u16(p + 4), length = ld_u16(p + 6);
            p += 8;
            PyObject *value;
            if (kind == RR_ATTR_STR) {
                if (end - p < (Py_ssize_t)length) {
                    rr_corrupt(position);
                    goto done;
                }
                value = PyUnicode_DecodeUTF8(p, length, "surrogatepass");
                p += ((Py_ssize_t)length + 7) / 8 * 8;
            } else {
                if (end - p < 8) {
                    rr_corrupt(position);
                    goto done;
                }
                if (kind == RR_ATTR_FLOAT) {
                    double d;
                    memcpy(&d, p, 8);
                    value = PyFloat_FromDouble(d);
                } else if (kind == RR_ATTR_BOOL) {
                    value = PyBool_FromLong(ld_i64(p) != 0);
                } else {
                    value = PyLong_FromLongLong(ld_i64(p));
                }
                p += 8;
            }
            if (value == NULL) {
                goto done;
            }
            PyObject *key = rr_lookup(strings, key_id);
            int bad = key == NULL || PyDict_SetItem(attrs, key, value) < 0;
            Py_DECREF(value);
            if (bad) {
                goto done;
            }
        }
    }
    PyObject *loader = Py_None;
    if (loader_id >= 0 && (loader = rr_lookup(strings, loader_id)) == NULL) {
        goto done;
    }
    if ((args[0] = PyLong_FromLongLong(index)) == NULL ||
        (args[2] = PyLong_FromLongLong(start_ns)) == NULL ||
        (args[3] = PyLong_FromLongLong(end_ns)) == NULL) {
        goto done;
    }
    args[1] = loader;
    args[4] = ev;
    args[5] = attrs ? attrs : Py_None;
    result = PyObject_Vectorcall(step_type, args, 6, NULL);
done:
    Py_XDECREF(args[0]);
    Py_XDECREF(args[2]);
    Py_XDECREF(args[3]);
    Py_XDECREF(attrs);
    Py_DECREF(ev);
    return result;
}

/* Appends (item, end, ordinal) to `out`; steals `item`. */
static int
rr_append(PyObject *out, PyObject *item, uint64_t end, long long ordinal)
{
    if (item == NULL) {
        return -1;
    }
    PyObject *t = Py_BuildValue("(NKL)", item, (unsigned long long)end, ordinal);
    if (t == NULL) {
        return -1;
    }
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* The read loop over `view` (the ring's mapping) from `position`; see the Python doc. */
static PyObject *
rr_read(Py_buffer *view, uint64_t cap, uint64_t position, Py_ssize_t max_items,
        int move_tail, PyObject *strings, PyObject *phases, PyObject *phase_type,
        PyObject *step_type, PyObject *queued)
{
    char *base = (char *)view->buf;
    if (cap == 0 || (uint64_t)view->len < RR_HEADER_BYTES + cap) {
        PyErr_SetString(PyExc_ValueError, "step ring: buffer smaller than its capacity");
        return NULL;
    }
    uint64_t *head_p = (uint64_t *)(base + RR_OFF_HEAD);
    uint64_t *tail_p = (uint64_t *)(base + RR_OFF_TAIL);
    /* acquire: pairs with the writer's release store of head (the record's bytes first) */
    uint64_t head = __atomic_load_n(head_p, __ATOMIC_ACQUIRE);
    uint64_t tail = position;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    while (tail < head && (max_items < 0 || PyList_GET_SIZE(out) < max_items)) {
        uint64_t at = tail % cap;
        if (cap - at < 8) { /* too little room for a PAD: the writer skipped it */
            tail += cap - at;
            continue;
        }
        const char *rec = base + RR_HEADER_BYTES + at;
        uint32_t size = ld_u32(rec);
        uint16_t kind = ld_u16(rec + 4), count = ld_u16(rec + 6);
        if (size < 8 || size > cap - at) {
            PyErr_Format(PyExc_ValueError, "step ring: corrupt record of %u bytes at %llu",
                         size, (unsigned long long)tail);
            goto fail;
        }
        const char *body = rec + 8, *rec_end = rec + size;
        uint64_t end = tail + size;
        if (kind == RR_STEP) {
            if (rr_append(out, rr_step(body, rec_end, count, strings, phases, step_type, tail),
                          end, -1) < 0) {
                goto fail;
            }
        } else if (kind == RR_STRING) {
            if (size < 16 || (uint32_t)ld_u16(body + 4) > size - 16) {
                rr_corrupt(tail);
                goto fail;
            }
            PyObject *id = PyLong_FromUnsignedLong(ld_u32(body));
            PyObject *text = id ? PyUnicode_DecodeUTF8(body + 8, ld_u16(body + 4),
                                                      "surrogatepass") : NULL;
            int bad = text == NULL || PyDict_SetItem(strings, id, text) < 0;
            Py_XDECREF(id);
            Py_XDECREF(text);
            if (bad) {
                goto fail;
            }
        } else if (kind == RR_QUEUED) {
            long long ordinal = size >= 16 ? (long long)ld_u64(body) : -1;
            Py_INCREF(queued);
            if (rr_append(out, queued, end, ordinal) < 0) {
                goto fail;
            }
        } else if (kind == RR_PHASE) {
            if (size < 24) {
                rr_corrupt(tail);
                goto fail;
            }
            int32_t loader_id = ld_i32(body + 12);
            PyObject *name = rr_lookup(strings, ld_i32(body + 4));
            PyObject *pkind = name ? rr_lookup(strings, ld_i32(body + 8)) : NULL;
            PyObject *loader = pkind == NULL ? NULL
                               : loader_id >= 0 ? rr_lookup(strings, loader_id) : Py_None;
            if (loader == NULL) {
                goto fail;
            }
            PyObject *phase = PyObject_CallFunctionObjArgs(phase_type, name, pkind, loader,
                                                           NULL);
            PyObject *id = phase ? PyLong_FromUnsignedLong(ld_u32(body)) : NULL;
            int bad = id == NULL || PyDict_SetItem(phases, id, phase) < 0;
            Py_XDECREF(id);
            Py_XDECREF(phase);
            if (bad) {
                goto fail;
            }
        }
        tail = end;
        if (move_tail) { /* the record is read: its room is free */
            __atomic_store_n(tail_p, tail, __ATOMIC_RELEASE);
        }
    }
    PyObject *result = Py_BuildValue("(NK)", out, (unsigned long long)tail);
    return result;
fail:
    Py_DECREF(out);
    return NULL;
}

PyObject *
otr_ring_read_items(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "ring_read_items(buffer, capacity, position, max_items, move_tail, "
                        "strings, phases, phase_type, step_type, queued)");
        return NULL;
    }
    unsigned long long cap = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long position = cap == (unsigned long long)-1 && PyErr_Occurred()
                                      ? 0 : PyLong_AsUnsignedLongLong(args[2]);
    /* None: every record up to head (-1 here); a negative count reads none, as in Python */
    Py_ssize_t max_items = args[3] == Py_None ? -1 : PyLong_AsSsize_t(args[3]);
    if (max_items < -1 || (max_items == -1 && args[3] != Py_None)) {
        max_items = 0;
    }
    int move_tail = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || move_tail < 0) {
        return NULL;
    }
    if (!PyDict_CheckExact(args[5]) || !PyDict_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "ring_read_items: strings and phases are dicts");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    PyObject *result = rr_read(&view, cap, position, max_items, move_tail, args[5], args[6],
                               args[7], args[8], args[9]);
    PyBuffer_Release(&view);
    return result;
}
