/* RingWriterCore: the step ring's producer in C (twin: step_ring.StepRingWriter).
 *
 * At a flat step's end the step loop (and Recorder.finish_step) hands the step here: its
 * record (index, start, end, loader, each phase's id with its start and end) is written into
 * the shared-memory ring whose layout step_ring.py describes, and `head` is published with a
 * release store, so the reader (another process, or the span worker) that loads it with
 * acquire sees the record's bytes. Only the common case is done here: a step with no rare
 * field set but root attributes the ring carries (numbers, booleans, short strings), every
 * phase, the loader and each key already interned. Anything else (a new phase, loader or
 * key, another attribute value, a full ring, which is counted, a step the ring cannot carry,
 * whose place a QUEUED marker holds) goes to the Python writer (`slow_write`).
 */
#include "_recorder_c.h"
#include <stdint.h>
#include <string.h>

#define RING_HEADER_BYTES 256
#define RING_OFF_HEAD 64
#define RING_OFF_TAIL 128
#define RING_OFF_WRITTEN_STEPS 208
#define RING_REC_STEP 3
#define RING_STEP_BYTES 32       /* i64 index, start, end; i32 loader; u32 attributes */
#define RING_STEP_PHASE_BYTES 24 /* u32 id, 4 pad, i64 start, i64 end */
#define RING_MAX_PHASES 64       /* more: the Python writer */
#define RING_MAX_ATTRS 16        /* more root attributes: the Python writer */
#define RING_MAX_STRING 256      /* step_ring.MAX_STRING_BYTES */
enum { RING_ATTR_BOOL, RING_ATTR_INT, RING_ATTR_FLOAT, RING_ATTR_STR };

/* One root attribute as the ring carries it (step_ring.ring_attribute). */
typedef struct {
    int32_t key;
    uint16_t type;
    uint16_t length;  /* bytes of a string; 8 for a number */
    const char *text; /* a string's utf-8 (borrowed from the str) */
    char value[8];    /* a number's bytes */
} RingAttr;

static PyObject *s_attrs_name; /* "attrs" */

/* The step's root attributes into `out`: their count, or -2 when the Python writer must
 * decide (a new key, a value the C path does not encode), -1 on error. */
static int
ring_attributes(PyObject *attrs, PyObject *string_ids, RingAttr *out)
{
    if (!PyDict_CheckExact(attrs) || PyDict_GET_SIZE(attrs) > RING_MAX_ATTRS) {
        return -2;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int n = 0;
    while (PyDict_Next(attrs, &pos, &key, &value)) {
        RingAttr *a = &out[n++];
        if (!PyUnicode_CheckExact(key)) {
            return -2;
        }
        PyObject *id = PyDict_GetItemWithError(string_ids, key);
        if (id == NULL) {
            return PyErr_Occurred() ? -1 : -2; /* a new key: its definition first */
        }
        a->key = (int32_t)PyLong_AsLong(id);
        a->text = NULL;
        a->length = 8;
        if (PyBool_Check(value)) {
            int64_t v = value == Py_True;
            a->type = RING_ATTR_BOOL;
            memcpy(a->value, &v, 8);
        }
        else if (PyLong_CheckExact(value)) {
            long long v = PyLong_AsLongLong(value);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return -2; /* beyond 64 bits */
            }
            a->type = RING_ATTR_INT;
            memcpy(a->value, &v, 8);
        }
        else if (PyFloat_CheckExact(value)) {
            double v = PyFloat_AS_DOUBLE(value);
            a->type = RING_ATTR_FLOAT;
            memcpy(a->value, &v, 8);
        }
        else if (PyUnicode_CheckExact(value)) {
            Py_ssize_t len;
            const char *text = PyUnicode_AsUTF8AndSize(value, &len);
            if (text == NULL) {
                PyErr_Clear(); /* surrogates: the Python writer encodes them */
                return -2;
            }
            if (len > RING_MAX_STRING) {
                return -2;
            }
            a->type = RING_ATTR_STR;
            a->length = (uint16_t)len;
            a->text = text;
        }
        else {
            return -2;
        }
    }
    return n;
}

typedef struct {
    PyObject_HEAD
    Py_buffer view;       /* the ring's whole mapping (header and data) */
    int has_view;
    uint64_t capacity;
    PyObject *phase_ids;  /* Phase -> id, shared with the Python writer */
    PyObject *string_ids; /* str -> id, shared with the Python writer */
    PyObject *slow_write; /* the Python writer's write_step */
} RingWriterCore;

static int
RingWriterCore_init(RingWriterCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "capacity", "phase_ids", "string_ids", "slow_write",
                             NULL};
    PyObject *buffer, *phase_ids, *string_ids, *slow_write;
    unsigned long long capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKO!O!O:RingWriterCore", kwlist, &buffer,
                                     &capacity, &PyDict_Type, &phase_ids, &PyDict_Type,
                                     &string_ids, &slow_write)) {
        return -1;
    }
    if (self->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "RingWriterCore: already initialized");
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    self->has_view = 1;
    if (capacity == 0 || capacity % 8 || (uint64_t)self->view.len < RING_HEADER_BYTES + capacity
        || ((uintptr_t)self->view.buf & 7)) {
        PyErr_SetString(PyExc_ValueError, "RingWriterCore: buffer too small for capacity");
        return -1;
    }
    self->capacity = capacity;
    Py_INCREF(phase_ids);
    Py_XSETREF(self->phase_ids, phase_ids);
    Py_INCREF(string_ids);
    Py_XSETREF(self->string_ids, string_ids);
    Py_INCREF(slow_write);
    Py_XSETREF(self->slow_write, slow_write);
    return 0;
}

static int
RingWriterCore_traverse(RingWriterCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->phase_ids);
    Py_VISIT(self->string_ids);
    Py_VISIT(self->slow_write);
    return 0;
}

static int
RingWriterCore_clear(RingWriterCore *self)
{
    Py_CLEAR(self->phase_ids);
    Py_CLEAR(self->string_ids);
    Py_CLEAR(self->slow_write);
    return 0;
}

static void
RingWriterCore_dealloc(RingWriterCore *self)
{
    PyObject_GC_UnTrack(self);
    RingWriterCore_clear(self);
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The Python writer's answer for `step`: 1 carried (written or counted dropped), 0 not. */
static int
slow_path(RingWriterCore *self, PyObject *step)
{
    PyObject *r = PyObject_CallOneArg(self->slow_write, step);
    if (r == NULL) {
        return -1;
    }
    int carried = PyObject_IsTrue(r);
    Py_DECREF(r);
    return carried;
}

/* 1: the ring carries `step` (written, or dropped and counted); 0: it goes the queue;
 * -1: an error is set. */
int
otr_ring_write(PyObject *writer, PyObject *step)
{
    RingWriterCore *self = (RingWriterCore *)writer;
    StepCore *core = (StepCore *)step;
    if (!self->has_view || self->phase_ids == NULL) {
        return 0;
    }
    if (core->error != NULL && core->error != Py_None) {
        return slow_path(self, step); /* it leaves the queue's marker */
    }
    /* The rare fields (ids handed to user spans, device readings...) live in the instance
     * dict: the Python writer reads those. Root attributes alone are encoded here. */
    RingAttr attrs[RING_MAX_ATTRS];
    int n_attrs = 0;
    PyObject **dictptr = _PyObject_GetDictPtr(step);
    if (dictptr != NULL && *dictptr != NULL && PyDict_GET_SIZE(*dictptr) > 0) {
        if (PyDict_GET_SIZE(*dictptr) != 1) {
            return slow_path(self, step);
        }
        if (s_attrs_name == NULL && (s_attrs_name = PyUnicode_InternFromString("attrs")) == NULL) {
            return -1;
        }
        PyObject *root = PyDict_GetItemWithError(*dictptr, s_attrs_name);
        if (root == NULL) {
            return PyErr_Occurred() ? -1 : slow_path(self, step);
        }
        if (root != Py_None && (!PyDict_CheckExact(root) || PyDict_GET_SIZE(root) > 0)) {
            n_attrs = ring_attributes(root, self->string_ids, attrs);
            if (n_attrs == -2) {
                return slow_path(self, step);
            }
            if (n_attrs < 0) {
                return -1;
            }
        }
    }
    PyObject *ev = core->ev;
    if (ev == NULL || !PyList_CheckExact(ev)) {
        return slow_path(self, step);
    }
    Py_ssize_t n = PyList_GET_SIZE(ev);
    if (n == 0 || (n & 3) || n / 4 > RING_MAX_PHASES) {
        return slow_path(self, step);
    }
    Py_ssize_t phases = n / 4;
    uint32_t ids[RING_MAX_PHASES];
    long long starts[RING_MAX_PHASES], ends[RING_MAX_PHASES];
    for (Py_ssize_t i = 0; i < phases; i++) {
        PyObject **item = &PyList_GET_ITEM(ev, 4 * i);
        if (item[3] != Py_None || !PyLong_CheckExact(item[1]) || !PyLong_CheckExact(item[2])
            || !PyObject_TypeCheck(item[0], &otr_PhaseCore_Type)) {
            return slow_path(self, step); /* it decides: failed, nested, a foreign entry */
        }
        PyObject *id = PyDict_GetItemWithError(self->phase_ids, item[0]);
        if (id == NULL) {
            return PyErr_Occurred() ? -1 : slow_path(self, step); /* a new phase */
        }
        ids[i] = (uint32_t)PyLong_AsUnsignedLong(id);
        starts[i] = PyLong_AsLongLong(item[1]);
        ends[i] = PyLong_AsLongLong(item[2]);
        if (PyErr_Occurred()) {
            PyErr_Clear(); /* beyond 64 bits: the queue takes it */
            return slow_path(self, step);
        }
    }
    int32_t loader = -1;
    if (core->loader != NULL && core->loader != Py_None) {
        PyObject *id = PyDict_GetItemWithError(self->string_ids, core->loader);
        if (id == NULL) {
            return PyErr_Occurred() ? -1 : slow_path(self, step); /* a new loader */
        }
        loader = (int32_t)PyLong_AsLong(id);
    }
    long long index = PyLong_AsLongLong(core->index);
    long long start = PyLong_AsLongLong(core->start_ns);
    long long end = PyLong_AsLongLong(core->end_ns);
    if (PyErr_Occurred()) {
        PyErr_Clear(); /* beyond 64 bits, or no int: the queue takes it */
        return slow_path(self, step);
    }
    uint64_t size = 8 + RING_STEP_BYTES + RING_STEP_PHASE_BYTES * (uint64_t)phases;
    for (int i = 0; i < n_attrs; i++) {
        size += 8 + (attrs[i].text != NULL ? ((uint64_t)attrs[i].length + 7) / 8 * 8 : 8);
    }
    char *base = (char *)self->view.buf;
    uint64_t *head_p = (uint64_t *)(base + RING_OFF_HEAD);
    uint64_t *tail_p = (uint64_t *)(base + RING_OFF_TAIL);
    uint64_t cap = self->capacity;
    uint64_t head = __atomic_load_n(head_p, __ATOMIC_RELAXED); /* ours alone */
    uint64_t tail = __atomic_load_n(tail_p, __ATOMIC_ACQUIRE); /* the reader's */
    uint64_t at = head % cap;
    uint64_t skip = cap - at < size ? cap - at : 0;
    if (cap - (head - tail) < size + skip) {
        return slow_path(self, step); /* full: the Python writer counts the drop */
    }
    char *data = base + RING_HEADER_BYTES;
    if (skip) {
        uint32_t pad[2] = {(uint32_t)skip, 0};
        memcpy(data + at, pad, 8);
        head += skip;
        at = 0;
    }
    char *p = data + at;
    uint32_t rec_head[2] = {(uint32_t)size, (uint32_t)RING_REC_STEP | ((uint32_t)phases << 16)};
    memcpy(p, rec_head, 8);
    memcpy(p + 8, &index, 8);
    memcpy(p + 16, &start, 8);
    memcpy(p + 24, &end, 8);
    memcpy(p + 32, &loader, 4);
    uint32_t attr_count = (uint32_t)n_attrs;
    memcpy(p + 36, &attr_count, 4);
    p += 8 + RING_STEP_BYTES;
    for (Py_ssize_t i = 0; i < phases; i++, p += RING_STEP_PHASE_BYTES) {
        memcpy(p, &ids[i], 4);
        memset(p + 4, 0, 4);
        memcpy(p + 8, &starts[i], 8);
        memcpy(p + 16, &ends[i], 8);
    }
    for (int i = 0; i < n_attrs; i++) {
        RingAttr *a = &attrs[i];
        memcpy(p, &a->key, 4);
        memcpy(p + 4, &a->type, 2);
        memcpy(p + 6, &a->length, 2);
        p += 8;
        if (a->text != NULL) {
            memcpy(p, a->text, a->length);
            p += ((uint64_t)a->length + 7) / 8 * 8;
        }
        else {
            memcpy(p, a->value, 8);
            p += 8;
        }
    }
    /* Release: the record's bytes are visible before the head that covers them. */
    __atomic_store_n(head_p, head + size, __ATOMIC_RELEASE);
    uint64_t *written = (uint64_t *)(base + RING_OFF_WRITTEN_STEPS);
    __atomic_store_n(written, __atomic_load_n(written, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
    return 1;
}

static PyObject *
RingWriterCore_write_step(RingWriterCore *self, PyObject *step)
{
    int r = PyObject_TypeCheck(step, &otr_StepCore_Type) ? otr_ring_write((PyObject *)self, step)
                                                         : slow_path(self, step);
    if (r < 0) {
        PyErr_Clear(); /* never raised into training: the queue takes the step */
        r = 0;
    }
    return PyBool_FromLong(r);
}

static PyObject *
RingWriterCore_release(RingWriterCore *self, PyObject *Py_UNUSED(ignored))
{
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_RETURN_NONE;
}

static PyMethodDef RingWriterCore_methods[] = {
    {"write_step", (PyCFunction)RingWriterCore_write_step, METH_O,
     "write_step(step) -> bool: the ring carries the step (written, or dropped and counted)."},
    {"release", (PyCFunction)RingWriterCore_release, METH_NOARGS,
     "Let go of the ring's memory; write_step then carries nothing."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject otr_RingWriterCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._recorder_c.RingWriterCore",
    .tp_doc = "The step ring's producer in C (twin: step_ring.StepRingWriter).",
    .tp_basicsize = sizeof(RingWriterCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RingWriterCore_init,
    .tp_dealloc = (destructor)RingWriterCore_dealloc,
    .tp_traverse = (traverseproc)RingWriterCore_traverse,
    .tp_clear = (inquiry)RingWriterCore_clear,
    .tp_methods = RingWriterCore_methods,
};
