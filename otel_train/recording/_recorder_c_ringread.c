/* ring_read_items: the step ring's consumer in C (twin: step_ring_reader.StepRingReader's
 * read loop, `_read_items_python`).
 *
 * The exporter process reads every ring record here: from the ring's bytes straight to the
 * items the Python reader makes (a RingStep, this file's C twin of the Python reader's, with
 * its root attributes, its phases kept in C until its event list is read; the QUEUED marker
 * in its place), the string and phase definitions kept in the reader's own
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

/* ---- RingStep: a ring step as the C reader makes it ----------------------------------- */

/* The twin of step_ring_reader.RingStep (the Python reader's), with the same fields, read
 * only: its phases stay in C (entry and two times each) and `ev` is made on first read and
 * kept, so flat_step_records builds the common step's record from them without the event
 * list and its ints. Not tracked by the GC: it refers to strings, numbers, RingPhases and
 * its own list and dict, none of which can refer back to it. */

static void
RingStep_dealloc(RingStepCore *self)
{
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) {
        Py_DECREF(self->phases[i].phase);
    }
    Py_XDECREF(self->loader);
    Py_XDECREF(self->attrs);
    Py_XDECREF(self->ev);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
RingStep_ev(RingStepCore *self, void *Py_UNUSED(closure))
{
    if (self->ev == NULL) {
        Py_ssize_t n = Py_SIZE(self);
        PyObject *ev = PyList_New(4 * n);
        for (Py_ssize_t i = 0; ev != NULL && i < n; i++) {
            RingStepPhase *ph = &self->phases[i];
            PyObject *start = PyLong_FromLongLong(ph->start_ns);
            PyObject *stop = start ? PyLong_FromLongLong(ph->end_ns) : NULL;
            if (stop == NULL) {
                Py_XDECREF(start);
                Py_CLEAR(ev);
                break;
            }
            Py_INCREF(ph->phase);
            Py_INCREF(Py_None);
            PyList_SET_ITEM(ev, 4 * i, ph->phase);
            PyList_SET_ITEM(ev, 4 * i + 1, start);
            PyList_SET_ITEM(ev, 4 * i + 2, stop);
            PyList_SET_ITEM(ev, 4 * i + 3, Py_None);
        }
        if (ev == NULL) {
            return NULL;
        }
        self->ev = ev;
    }
    Py_INCREF(self->ev);
    return self->ev;
}

static PyObject *
RingStep_index(RingStepCore *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->index);
}

static PyObject *
RingStep_start_ns(RingStepCore *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->start_ns);
}

static PyObject *
RingStep_end_ns(RingStepCore *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->end_ns);
}

static PyObject *
RingStep_loader(RingStepCore *self, void *Py_UNUSED(closure))
{
    return slot_get(self->loader);
}

static PyObject *
RingStep_attrs(RingStepCore *self, void *Py_UNUSED(closure))
{
    return slot_get(self->attrs);
}

/* The fields a ring step never has (the Python twin's class attributes). */
static PyObject *
RingStep_none(PyObject *Py_UNUSED(self), void *Py_UNUSED(closure))
{
    Py_RETURN_NONE;
}

static PyObject *
RingStep_zero(PyObject *Py_UNUSED(self), void *Py_UNUSED(closure))
{
    Py_INCREF(otr_zero);
    return otr_zero;
}

static PyObject *
RingStep_span_count(RingStepCore *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(1 + Py_SIZE(self));  /* root + phases */
}

static PyObject *
RingStep_repr(RingStepCore *self)
{
    return PyUnicode_FromFormat("<RingStep %lld>", self->index);
}

static PyGetSetDef RingStep_getset[] = {
    {"index", (getter)RingStep_index, NULL, "the step's index", NULL},
    {"loader", (getter)RingStep_loader, NULL, "the step's loader, or None", NULL},
    {"start_ns", (getter)RingStep_start_ns, NULL, "perf_counter_ns of its start", NULL},
    {"end_ns", (getter)RingStep_end_ns, NULL, "perf_counter_ns of its end", NULL},
    {"ev", (getter)RingStep_ev, NULL, "its event list (phase, start, end, None each)", NULL},
    {"attrs", (getter)RingStep_attrs, NULL, "its root attributes, or None", NULL},
    {"error", (getter)RingStep_none, NULL, "None: a ring step did not fail", NULL},
    {"phase_attrs", (getter)RingStep_none, NULL, "None", NULL},
    {"dev", (getter)RingStep_none, NULL, "None", NULL},
    {"span_ids", (getter)RingStep_none, NULL, "None", NULL},
    {"queued_waits", (getter)RingStep_none, NULL, "None", NULL},
    {"batch", (getter)RingStep_none, NULL, "None", NULL},
    {"trace_id", (getter)RingStep_zero, NULL, "0: drawn from its index", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef RingStep_methods[] = {
    {"span_count", (PyCFunction)RingStep_span_count, METH_NOARGS,
     "Spans this step will produce (root + phases)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject otr_RingStep_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._recorder_c.RingStep",
    .tp_doc = "A flat step read back from the step ring by the C reader (twin: "
              "step_ring_reader.RingStep).",
    .tp_basicsize = offsetof(RingStepCore, phases),
    .tp_itemsize = sizeof(RingStepPhase),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)RingStep_dealloc,
    .tp_repr = (reprfunc)RingStep_repr,
    .tp_getset = RingStep_getset,
    .tp_methods = RingStep_methods,
};

/* The root attributes of a STEP record (`n` of them from `*at`, which moves past them), a
 * new dict, or NULL. */
static PyObject *
rr_attrs(const char **at, const char *end, uint32_t n, PyObject *strings, uint64_t position)
{
    const char *p = *at;
    PyObject *attrs = PyDict_New();
    if (attrs == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (end - p < 8) {
            goto corrupt;
        }
        int32_t key_id = ld_i32(p);
        uint16_t kind = ld_u16(p + 4), length = ld_u16(p + 6);
        p += 8;
        PyObject *value;
        if (kind == RR_ATTR_STR) {
            if (end - p < (Py_ssize_t)length) {
                goto corrupt;
            }
            value = PyUnicode_DecodeUTF8(p, length, "surrogatepass");
            p += ((Py_ssize_t)length + 7) / 8 * 8;
        } else {
            if (end - p < 8) {
                goto corrupt;
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
            goto fail;
        }
        PyObject *key = rr_lookup(strings, key_id);
        int bad = key == NULL || PyDict_SetItem(attrs, key, value) < 0;
        Py_DECREF(value);
        if (bad) {
            goto fail;
        }
    }
    *at = p;
    return attrs;
corrupt:
    rr_corrupt(position);
fail:
    Py_DECREF(attrs);
    return NULL;
}

/* The RingStep of the STEP record whose body starts at `p` (`end`: its record's end). */
static PyObject *
rr_step(const char *p, const char *end, int count, PyObject *strings, PyObject *phases,
        uint64_t position)
{
    if (end - p < 32 + 24 * (Py_ssize_t)count) {
        return rr_corrupt(position);
    }
    int32_t loader_id = ld_i32(p + 24);
    uint32_t n_attrs = ld_u32(p + 28);
    RingStepCore *step = PyObject_NewVar(RingStepCore, &otr_RingStep_Type, count);
    if (step == NULL) {
        return NULL;
    }
    step->index = ld_i64(p);
    step->start_ns = ld_i64(p + 8);
    step->end_ns = ld_i64(p + 16);
    step->loader = step->attrs = step->ev = NULL;
    Py_SET_SIZE(step, 0);  /* the phases filled so far: what a failure below frees */
    p += 32;
    for (int i = 0; i < count; i++, p += 24) {
        PyObject *phase = rr_lookup(phases, ld_u32(p));
        if (phase == NULL) {
            goto fail;
        }
        RingStepPhase *ph = &step->phases[i];
        Py_INCREF(phase);
        ph->phase = phase;
        ph->start_ns = ld_i64(p + 8);
        ph->end_ns = ld_i64(p + 16);
        Py_SET_SIZE(step, i + 1);
    }
    if (n_attrs && (step->attrs = rr_attrs(&p, end, n_attrs, strings, position)) == NULL) {
        goto fail;
    }
    PyObject *loader = Py_None;
    if (loader_id >= 0 && (loader = rr_lookup(strings, loader_id)) == NULL) {
        goto fail;
    }
    Py_INCREF(loader);
    step->loader = loader;
    return (PyObject *)step;
fail:
    Py_DECREF(step);
    return NULL;
}

/* Appends (item, end, ordinal) to `out`; steals `item`. */
static int
rr_append(PyObject *out, PyObject *item, uint64_t end, long long ordinal)
{
    if (item == NULL) {
        return -1;
    }
    PyObject *t = PyTuple_New(3);
    PyObject *at = t ? PyLong_FromUnsignedLongLong(end) : NULL;
    PyObject *ord = at ? PyLong_FromLongLong(ordinal) : NULL;
    if (ord == NULL) {
        Py_DECREF(item);
        Py_XDECREF(t);
        Py_XDECREF(at);
        return -1;
    }
    PyTuple_SET_ITEM(t, 0, item);
    PyTuple_SET_ITEM(t, 1, at);
    PyTuple_SET_ITEM(t, 2, ord);
    /* A RingStep (no GC type), QUEUED (a str) and ints: in no cycle, so not tracked */
    PyObject_GC_UnTrack(t);
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* The read loop over `view` (the ring's mapping) from `position`; see the Python doc. */
static PyObject *
rr_read(Py_buffer *view, uint64_t cap, uint64_t position, Py_ssize_t max_items,
        int move_tail, PyObject *strings, PyObject *phases, PyObject *phase_type,
        PyObject *queued)
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
            if (rr_append(out, rr_step(body, rec_end, count, strings, phases, tail), end,
                          -1) < 0) {
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
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "ring_read_items(buffer, capacity, position, max_items, move_tail, "
                        "strings, phases, phase_type, queued)");
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
                               args[7], args[8]);
    PyBuffer_Release(&view);
    return result;
}
