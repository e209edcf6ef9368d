/* otel_train._recorder_c: the recorder's hot path in C, an optional accelerator.
 *
 * Three types, each the twin of pure Python in recorder.py, which stays the reference and
 * runs wherever this module was not built (or OTEL_TRAIN_PURE_PYTHON=1 is set):
 *
 * - PhaseCore, the base of recorder.Phase (twin: _PurePhaseCore). __enter__ appends
 *   (phase, start_ns) to the current step's event list, __exit__ appends (end_ns, exception
 *   or None), with no Python frame per phase boundary.
 * - StepCore, the base of recorder.Step (twin: _PureStepCore). The fields every step has live
 *   in C slots, and step.phase(name) / step.monitor(name) look the phase up in C, refusing
 *   once the step has ended (the twin shadows them with the tables' lookups instead).
 * - StepLoop, what Recorder.steps returns (twin: the generator Recorder._steps_python). Each
 *   __next__ ends the previous step (unless the loop body ended it) and starts the next, the
 *   fetch timed as the data phase. Leaving the loop (break, an exception in its body) closes
 *   it: the step in progress ends and is held, as GeneratorExit does to the generator.
 *
 * Why C: with steps 1 ms apart (caches cold, as in a real loop), a 7-span step's context
 * managers cost 1.5-1.8x six empty Python `with` blocks in pure Python, and the Python
 * frames of __enter__/__exit__, the generator and the instance-dict stores of a new Step are
 * most of the difference (benchmarks/bench_hot_path.py). Everything else (the device modes,
 * the rare paths, the errors' messages) calls back into the Python objects, so both twins
 * share one behaviour; tests/test_recorder_c.py runs the hot-path tests against both and
 * compares their records.
 *
 * Timestamps equal time.perf_counter_ns(): on Linux both read CLOCK_MONOTONIC; elsewhere
 * this module calls time.perf_counter_ns itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#if defined(__linux__)
#include <time.h>
#endif

static PyObject *s_ev, *s_current, *s_error, *s_end_ns,
    *s_release_held, *s_device_step_start,
    *s_device_step_end, *s_drops, *s_add, *s_span_count, *s_finish_step, *s_queue_full,
    *s_outside_error, *s_ended_error, *s_append, *s_train_phases, *s_monitor_phases;
static PyObject *perf_counter_ns; /* time.perf_counter_ns, where no direct clock is used */
static PyObject *one;             /* 1, for next_index + 1 */
static PyObject *zero;            /* 0: a step's end_ns until it ends */

/* A new reference to perf_counter_ns() as an int, or NULL with an exception set. */
static PyObject *
clock_ns(void)
{
#if defined(__linux__)
    /* CPython's perf_counter_ns on Linux: clock_gettime(CLOCK_MONOTONIC), in ns. */
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
        return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    }
#endif
    return PyObject_CallNoArgs(perf_counter_ns);
}

/* Sets the exception that `factory(arg)` returns (a Python helper builds the message). */
static void
raise_from_factory(PyObject *factory, PyObject *arg)
{
    PyObject *exc = PyObject_CallOneArg(factory, arg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* ---- RecorderCore --------------------------------------------------------------------- */

/* The recorder's fields that every step and phase boundary reads or writes, in C slots (the
 * base of recorder.Recorder; twin: _PureRecorderCore, plain attributes). */
typedef struct {
    PyObject_HEAD
    PyObject *ev;               /* the current step's event list, None between steps */
    PyObject *current;          /* the step in progress, or None */
    PyObject *held;             /* a step closed by leaving the loop, until the next event */
    PyObject *closed;
    PyObject *next_index;
    PyObject *last_step_end_ns;
    PyObject *queue;            /* finished steps for the background */
    PyObject *max_queued;
} RecorderCore;

static PyObject *
RecorderCore_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    RecorderCore *self = (RecorderCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    PyObject **none_slots[] = {&self->ev, &self->current, &self->held, &self->queue};
    for (size_t i = 0; i < sizeof(none_slots) / sizeof(none_slots[0]); i++) {
        Py_INCREF(Py_None);
        *none_slots[i] = Py_None;
    }
    Py_INCREF(Py_False);
    self->closed = Py_False;
    PyObject **zero_slots[] = {&self->next_index, &self->last_step_end_ns, &self->max_queued};
    for (size_t i = 0; i < sizeof(zero_slots) / sizeof(zero_slots[0]); i++) {
        Py_INCREF(zero);
        *zero_slots[i] = zero;
    }
    return (PyObject *)self;
}

static int
RecorderCore_traverse(RecorderCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ev);
    Py_VISIT(self->current);
    Py_VISIT(self->held);
    Py_VISIT(self->closed);
    Py_VISIT(self->next_index);
    Py_VISIT(self->last_step_end_ns);
    Py_VISIT(self->queue);
    Py_VISIT(self->max_queued);
    return 0;
}

static int
RecorderCore_clear(RecorderCore *self)
{
    Py_CLEAR(self->ev);
    Py_CLEAR(self->current);
    Py_CLEAR(self->held);
    Py_CLEAR(self->closed);
    Py_CLEAR(self->next_index);
    Py_CLEAR(self->last_step_end_ns);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->max_queued);
    return 0;
}

static void
RecorderCore_dealloc(RecorderCore *self)
{
    PyObject_GC_UnTrack(self);
    RecorderCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef RecorderCore_members[] = {
    {"ev", T_OBJECT_EX, offsetof(RecorderCore, ev), 0, "the current step's event list"},
    {"current", T_OBJECT_EX, offsetof(RecorderCore, current), 0, "the step in progress"},
    {"held", T_OBJECT_EX, offsetof(RecorderCore, held), 0, "the step held back, or None"},
    {"closed", T_OBJECT_EX, offsetof(RecorderCore, closed), 0, "no step starts any more"},
    {"next_index", T_OBJECT_EX, offsetof(RecorderCore, next_index), 0, "the next index"},
    {"last_step_end_ns", T_OBJECT_EX, offsetof(RecorderCore, last_step_end_ns), 0,
     "perf_counter_ns of the last step's end (0: none yet)"},
    {"queue", T_OBJECT_EX, offsetof(RecorderCore, queue), 0, "finished steps"},
    {"max_queued", T_OBJECT_EX, offsetof(RecorderCore, max_queued), 0, "the queue's bound"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecorderCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._recorder_c.RecorderCore",
    .tp_doc = "The recorder's hot fields (the base of recorder.Recorder).",
    .tp_basicsize = sizeof(RecorderCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = RecorderCore_new,
    .tp_dealloc = (destructor)RecorderCore_dealloc,
    .tp_traverse = (traverseproc)RecorderCore_traverse,
    .tp_clear = (inquiry)RecorderCore_clear,
    .tp_members = RecorderCore_members,
};

/* A new reference to a slot's value; None where `del` emptied it. */
static inline PyObject *
slot_get(PyObject *value)
{
    value = value != NULL ? value : Py_None;
    Py_INCREF(value);
    return value;
}

/* Store a new reference to `value` in the slot `*slot`. */
static inline void
store(PyObject **slot, PyObject *value)
{
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
}

/* ---- PhaseCore ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *rec;
    PyObject *name;
    PyObject *kind;
    PyObject *loader;
    RecorderCore *core; /* rec, when it is a RecorderCore (a borrowed view of rec) */
} PhaseCore;

static int
PhaseCore_init(PhaseCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"recorder", "name", "kind", "loader", NULL};
    PyObject *rec, *name, *kind, *loader = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|O:Phase", kwlist, &rec, &name, &kind,
                                     &loader)) {
        return -1;
    }
    Py_INCREF(rec);
    Py_XSETREF(self->rec, rec);
    self->core = PyObject_TypeCheck(rec, &RecorderCore_Type) ? (RecorderCore *)rec : NULL;
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_INCREF(kind);
    Py_XSETREF(self->kind, kind);
    Py_INCREF(loader);
    Py_XSETREF(self->loader, loader);
    return 0;
}

static int
PhaseCore_traverse(PhaseCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->rec);
    Py_VISIT(self->name);
    Py_VISIT(self->kind);
    Py_VISIT(self->loader);
    return 0;
}

static int
PhaseCore_clear(PhaseCore *self)
{
    self->core = NULL;
    Py_CLEAR(self->rec);
    Py_CLEAR(self->name);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->loader);
    return 0;
}

static void
PhaseCore_dealloc(PhaseCore *self)
{
    PyObject_GC_UnTrack(self);
    PhaseCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The current step's event list (a new reference; Py_None between steps), or NULL. */
static PyObject *
current_events(PhaseCore *self)
{
    if (self->rec == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Phase used before Phase.__init__ ran");
        return NULL;
    }
    if (self->core != NULL) {
        return slot_get(self->core->ev);
    }
    return PyObject_GetAttr(self->rec, s_ev);
}

static PyObject *
PhaseCore_enter(PhaseCore *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *ev = current_events(self);
    if (ev == NULL) {
        return NULL;
    }
    if (ev == Py_None) {
        Py_DECREF(ev);
        PyObject *exc = PyObject_CallMethodNoArgs((PyObject *)self, s_outside_error);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    /* Two appends, as the twin does: a reader of the live list may see half a pair. */
    if (PyList_Append(ev, (PyObject *)self) < 0) {
        Py_DECREF(ev);
        return NULL;
    }
    PyObject *now = clock_ns();
    int rc = now == NULL ? -1 : PyList_Append(ev, now);
    Py_XDECREF(now);
    Py_DECREF(ev);
    if (rc < 0) {
        return NULL;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *
PhaseCore_exit(PhaseCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *now = clock_ns();
    if (now == NULL) {
        return NULL;
    }
    PyObject *exc = args[1];
    PyObject *ev = current_events(self);
    if (ev == NULL || ev == Py_None) {
        /* None: the step was ended inside this phase (e.g. by shutdown). */
        Py_DECREF(now);
        if (ev == NULL) {
            return NULL;
        }
        Py_DECREF(ev);
        Py_RETURN_FALSE;
    }
    int rc = PyList_Append(ev, now);
    Py_DECREF(now);
    if (rc == 0) {
        rc = PyList_Append(ev, exc);
    }
    Py_DECREF(ev);
    if (rc < 0) {
        return NULL;
    }
    if (exc != Py_None) {
        /* The step's first error: the root span of a failed phase's step fails too. */
        PyObject *step = self->core != NULL ? slot_get(self->core->current)
                                            : PyObject_GetAttr(self->rec, s_current);
        if (step == NULL) {
            return NULL;
        }
        if (step != Py_None) {
            PyObject *err = PyObject_GetAttr(step, s_error);
            if (err == NULL) {
                rc = -1;
            }
            else {
                if (err == Py_None) {
                    rc = PyObject_SetAttr(step, s_error, exc);
                }
                Py_DECREF(err);
            }
        }
        Py_DECREF(step);
        if (rc < 0) {
            return NULL;
        }
    }
    Py_RETURN_FALSE; /* never swallow: the exception propagates unchanged */
}

static PyMethodDef PhaseCore_methods[] = {
    {"__enter__", (PyCFunction)PhaseCore_enter, METH_NOARGS,
     "Open the phase: append (phase, start_ns) to the current step's events."},
    {"__exit__", (PyCFunction)(void (*)(void))PhaseCore_exit, METH_FASTCALL,
     "Close the phase: append (end_ns, exception or None)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PhaseCore_members[] = {
    {"_rec", T_OBJECT, offsetof(PhaseCore, rec), READONLY, "the Recorder"},
    {"name", T_OBJECT, offsetof(PhaseCore, name), READONLY, "the phase's span name"},
    {"kind", T_OBJECT, offsetof(PhaseCore, kind), READONLY, "train or monitor"},
    {"loader", T_OBJECT, offsetof(PhaseCore, loader), READONLY, "a data phase's loader"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PhaseCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._recorder_c.PhaseCore",
    .tp_doc = "A timed phase's hot path (the base of recorder.Phase).",
    .tp_basicsize = sizeof(PhaseCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PhaseCore_init,
    .tp_dealloc = (destructor)PhaseCore_dealloc,
    .tp_traverse = (traverseproc)PhaseCore_traverse,
    .tp_clear = (inquiry)PhaseCore_clear,
    .tp_methods = PhaseCore_methods,
    .tp_members = PhaseCore_members,
};

/* ---- StepCore ------------------------------------------------------------------------ */

/* The fields every step has, in C slots (no instance-dict stores on the hot path), and the
 * phase lookups, which refuse once the step has ended. recorder.Step adds the rest. */
typedef struct {
    PyObject_HEAD
    PyObject *index;
    PyObject *loader;
    PyObject *recorder;
    PyObject *start_ns;
    PyObject *end_ns; /* 0 until the step ends */
    PyObject *ev;
    PyObject *batch;
    PyObject *error;
} StepCore;

static PyObject *
StepCore_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    StepCore *self = (StepCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    /* The twin's class defaults: not ended, no batch, no error. */
    Py_INCREF(zero);
    self->end_ns = zero;
    Py_INCREF(Py_None);
    self->batch = Py_None;
    Py_INCREF(Py_None);
    self->error = Py_None;
    return (PyObject *)self;
}

static int
StepCore_traverse(StepCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->index);
    Py_VISIT(self->loader);
    Py_VISIT(self->recorder);
    Py_VISIT(self->start_ns);
    Py_VISIT(self->end_ns);
    Py_VISIT(self->ev);
    Py_VISIT(self->batch);
    Py_VISIT(self->error);
    return 0;
}

static int
StepCore_clear(StepCore *self)
{
    Py_CLEAR(self->index);
    Py_CLEAR(self->loader);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->start_ns);
    Py_CLEAR(self->end_ns);
    Py_CLEAR(self->ev);
    Py_CLEAR(self->batch);
    Py_CLEAR(self->error);
    return 0;
}

static void
StepCore_dealloc(StepCore *self)
{
    PyObject_GC_UnTrack(self);
    StepCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 if the step has ended, 0 if not, -1 on error. */
static int
step_ended(StepCore *self)
{
    PyObject *end = self->end_ns;
    if (end == zero || end == NULL) {
        return 0;
    }
    return PyObject_IsTrue(end);
}

/* The Phase `name` of the recorder's table `table` (train or monitor), or the error of a
 * phase opened on an ended step. */
static PyObject *
step_lookup(StepCore *self, PyObject *name, PyObject *table)
{
    int ended = step_ended(self);
    if (ended != 0) {
        if (ended > 0) {
            PyObject *exc = PyObject_CallMethodOneArg((PyObject *)self, s_ended_error, name);
            if (exc != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                Py_DECREF(exc);
            }
        }
        return NULL;
    }
    if (self->recorder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Step used before Step.__init__ ran");
        return NULL;
    }
    PyObject *phases = PyObject_GetAttr(self->recorder, table);
    if (phases == NULL) {
        return NULL;
    }
    PyObject *phase = PyObject_GetItem(phases, name); /* a missing name makes its Phase */
    Py_DECREF(phases);
    return phase;
}

static PyObject *
StepCore_phase(StepCore *self, PyObject *name)
{
    return step_lookup(self, name, s_train_phases);
}

static PyObject *
StepCore_monitor(StepCore *self, PyObject *name)
{
    return step_lookup(self, name, s_monitor_phases);
}

static PyMethodDef StepCore_methods[] = {
    {"phase", (PyCFunction)StepCore_phase, METH_O,
     "A training phase (forward, backward, optimizer, or your own name)."},
    {"monitor", (PyCFunction)StepCore_monitor, METH_O,
     "A monitoring phase (inference, val_loss, ...): counts toward monitoring overhead."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef StepCore_members[] = {
    {"index", T_OBJECT_EX, offsetof(StepCore, index), 0, "the step's index"},
    {"loader", T_OBJECT_EX, offsetof(StepCore, loader), 0, "the loader the batch came from"},
    {"_recorder", T_OBJECT_EX, offsetof(StepCore, recorder), 0, "the Recorder"},
    {"start_ns", T_OBJECT_EX, offsetof(StepCore, start_ns), 0, "perf_counter_ns at the start"},
    {"end_ns", T_OBJECT_EX, offsetof(StepCore, end_ns), 0, "perf_counter_ns at the end, or 0"},
    {"ev", T_OBJECT_EX, offsetof(StepCore, ev), 0, "the flat event list"},
    {"batch", T_OBJECT_EX, offsetof(StepCore, batch), 0, "the batch, until the step ends"},
    {"error", T_OBJECT_EX, offsetof(StepCore, error), 0, "the step's first error, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._recorder_c.StepCore",
    .tp_doc = "A step's fields and phase lookups (the base of recorder.Step).",
    .tp_basicsize = sizeof(StepCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = StepCore_new,
    .tp_dealloc = (destructor)StepCore_dealloc,
    .tp_traverse = (traverseproc)StepCore_traverse,
    .tp_clear = (inquiry)StepCore_clear,
    .tp_methods = StepCore_methods,
    .tp_members = StepCore_members,
};

/* ---- StepLoop ------------------------------------------------------------------------- */

enum { LOOP_READY, LOOP_RUNNING, LOOP_DONE };

typedef struct {
    PyObject_HEAD
    PyObject *rec;
    PyObject *it;
    PyObject *loader;
    PyObject *data;           /* the data Phase: it opens with each step */
    PyObject *step_type;      /* recorder.Step */
    PyObject *nested_error;   /* recorder._nested(step) -> RuntimeError */
    PyObject *sync;           /* recorder.synchronize (device_sync) or None */
    PyObject *pending;        /* the step last returned, until the next __next__ or close */
    PyObject *empty;          /* () for Step.__new__ */
    int plain;                /* host clock only: no device_step_start/_end calls */
    int state;
} StepLoop;

static int
StepLoop_traverse(StepLoop *self, visitproc visit, void *arg)
{
    Py_VISIT(self->rec);
    Py_VISIT(self->it);
    Py_VISIT(self->loader);
    Py_VISIT(self->data);
    Py_VISIT(self->step_type);
    Py_VISIT(self->nested_error);
    Py_VISIT(self->sync);
    Py_VISIT(self->pending);
    return 0;
}

static int
StepLoop_clear(StepLoop *self)
{
    Py_CLEAR(self->rec);
    Py_CLEAR(self->it);
    Py_CLEAR(self->loader);
    Py_CLEAR(self->data);
    Py_CLEAR(self->step_type);
    Py_CLEAR(self->nested_error);
    Py_CLEAR(self->sync);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->empty);
    return 0;
}

static PyObject *
StepLoop_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"recorder", "iterable", "loader", "data_phase", "step_type",
                             "nested_error", NULL};
    PyObject *rec, *iterable, *loader, *data, *step_type, *nested_error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO:StepLoop", kwlist, &rec, &iterable,
                                     &loader, &data, &step_type, &nested_error)) {
        return NULL;
    }
    if (!PyType_Check(step_type)
        || !PyType_IsSubtype((PyTypeObject *)step_type, &StepCore_Type)) {
        PyErr_SetString(PyExc_TypeError, "StepLoop: step_type must be a StepCore subclass");
        return NULL;
    }
    if (!PyObject_TypeCheck(rec, &RecorderCore_Type)) {
        PyErr_SetString(PyExc_TypeError, "StepLoop: recorder must be a RecorderCore");
        return NULL;
    }
    StepLoop *self = (StepLoop *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(rec);
    self->rec = rec;
    Py_INCREF(loader);
    self->loader = loader;
    Py_INCREF(data);
    self->data = data;
    Py_INCREF(step_type);
    self->step_type = step_type;
    Py_INCREF(nested_error);
    self->nested_error = nested_error;
    self->state = LOOP_READY;
    self->empty = PyTuple_New(0);
    self->it = PyObject_GetIter(iterable);
    if (self->empty == NULL || self->it == NULL) {
        goto fail;
    }
    /* What the generator twin reads once, when it starts. */
    PyObject *plain = PyObject_GetAttrString(rec, "plain");
    if (plain == NULL) {
        goto fail;
    }
    self->plain = PyObject_IsTrue(plain);
    Py_DECREF(plain);
    if (self->plain < 0) {
        goto fail;
    }
    self->sync = PyObject_GetAttrString(rec, "synchronize");
    if (self->sync == NULL) {
        goto fail;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* Ends `step` as Recorder.finish_step's usual path does, unless the loop body ended it. */
static int
end_step(StepLoop *self, PyObject *step)
{
    PyObject *rec = self->rec;
    StepCore *core = (StepCore *)step;
    int was_ended = step_ended(core);
    if (was_ended != 0) {
        return was_ended < 0 ? -1 : 0; /* ended in the body (step.end(), the run's shutdown) */
    }
    if (!self->plain) {
        PyObject *r = PyObject_CallMethodOneArg(rec, s_device_step_end, step);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    PyObject *end = clock_ns();
    if (end == NULL) {
        return -1;
    }
    store(&core->end_ns, end); /* from now on step.phase / step.monitor refuse */
    store(&core->batch, Py_None); /* the background must never keep a batch (or its memory) */
    RecorderCore *rc = (RecorderCore *)rec;
    if (rc->current == step) {
        store(&rc->current, Py_None);
        store(&rc->ev, Py_None);
    }
    Py_XSETREF(rc->last_step_end_ns, end); /* steals end */
    Py_ssize_t limit = rc->max_queued != NULL ? PyLong_AsSsize_t(rc->max_queued) : 0;
    if (limit == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *queue = slot_get(rc->queue);
    Py_ssize_t queued = PyObject_Size(queue);
    PyObject *r = NULL;
    if (queued >= 0 && queued < limit) {
        r = PyObject_CallMethodOneArg(queue, s_append, step);
    }
    else if (queued >= 0) {
        PyObject *drops = PyObject_GetAttr(rec, s_drops);
        PyObject *spans = drops == NULL ? NULL : PyObject_CallMethodNoArgs(step, s_span_count);
        r = spans == NULL ? NULL
                          : PyObject_CallMethodObjArgs(drops, s_add, s_queue_full, spans, NULL);
        Py_XDECREF(spans);
        Py_XDECREF(drops);
    }
    Py_DECREF(queue);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* The fetch raised: close the data phase with the error, end the step failed, re-raise. */
static void
fetch_failed(StepLoop *self, PyObject *step, PyObject *ev)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *now = clock_ns();
    PyObject *r = NULL;
    if (now != NULL && PyList_Append(ev, now) == 0 && PyList_Append(ev, value) == 0) {
        r = PyObject_CallMethodObjArgs(self->rec, s_finish_step, step, value, NULL);
    }
    Py_XDECREF(now);
    if (r == NULL) {
        /* Ending the step failed too: raise that, the fetch's error as its context. */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        PyException_SetContext(v2, value); /* steals value */
        Py_XDECREF(type);
        Py_XDECREF(tb);
        PyErr_Restore(t2, v2, tb2);
        return;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
}

/* Starts the next step and fetches its batch: a new reference, or NULL (an error, or the
 * end of the loop with no error set). */
static PyObject *
start_step(StepLoop *self)
{
    PyObject *rec = self->rec;
    RecorderCore *rc = (RecorderCore *)rec;
    if (rc->held != NULL && rc->held != Py_None) {
        PyObject *r = PyObject_CallMethodNoArgs(rec, s_release_held);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    if (rc->closed != NULL && rc->closed != Py_False) {
        int is_closed = PyObject_IsTrue(rc->closed);
        if (is_closed != 0) {
            return NULL; /* closed: the loop ends (or the truth test raised) */
        }
    }
    PyObject *cur = slot_get(rc->current);
    if (cur != Py_None) {
        PyObject *ended = PyObject_GetAttr(cur, s_end_ns);
        int was_ended = ended == NULL ? -1 : PyObject_IsTrue(ended);
        Py_XDECREF(ended);
        if (was_ended == 0) {
            raise_from_factory(self->nested_error, cur);
        }
        if (was_ended <= 0) {
            Py_DECREF(cur);
            return NULL;
        }
    }
    Py_DECREF(cur);

    /* The stores of Step.__init__, without its call. */
    PyTypeObject *step_type = (PyTypeObject *)self->step_type;
    PyObject *step = step_type->tp_new(step_type, self->empty, NULL);
    if (step == NULL) {
        return NULL;
    }
    StepCore *core = (StepCore *)step;
    PyObject *index = slot_get(rc->next_index);
    PyObject *next = PyNumber_Add(index, one);
    if (next == NULL) {
        Py_DECREF(index);
        Py_DECREF(step);
        return NULL;
    }
    Py_XSETREF(rc->next_index, next); /* steals next */
    store(&core->index, index);
    store(&core->loader, self->loader);
    store(&core->recorder, rec);
    if (!self->plain) {
        PyObject *r = PyObject_CallMethodOneArg(rec, s_device_step_start, step);
        if (r == NULL) {
            goto fail_index;
        }
        Py_DECREF(r);
    }
    PyObject *t = clock_ns();
    if (t == NULL) {
        goto fail_index;
    }
    store(&core->start_ns, t);
    PyObject *ev = PyList_New(2); /* the data phase opens with the step */
    if (ev == NULL) {
        Py_DECREF(t);
        goto fail_index;
    }
    Py_INCREF(self->data);
    PyList_SET_ITEM(ev, 0, self->data);
    PyList_SET_ITEM(ev, 1, t); /* steals t */
    store(&core->ev, ev);
    store(&rc->current, step);
    store(&rc->ev, ev);

    PyObject *batch = PyIter_Next(self->it);
    if (batch == NULL) {
        if (PyErr_Occurred()) {
            fetch_failed(self, step, ev);
        }
        else { /* no batch, no step */
            store(&rc->current, Py_None);
            store(&rc->ev, Py_None);
            store(&rc->next_index, index);
        }
        goto fail_ev;
    }
    if (self->sync != Py_None) {
        /* explicit: device work of the fetch (e.g. a copy) counts as data */
        PyObject *r = PyObject_CallNoArgs(self->sync);
        if (r == NULL) {
            Py_DECREF(batch);
            goto fail_ev;
        }
        Py_DECREF(r);
    }
    PyObject *now = clock_ns();
    int appended = now == NULL ? -1 : PyList_Append(ev, now);
    Py_XDECREF(now);
    if (appended < 0 || PyList_Append(ev, Py_None) < 0) {
        Py_DECREF(batch);
        goto fail_ev;
    }
    Py_XSETREF(core->batch, batch); /* steals batch */
    Py_DECREF(ev);
    Py_DECREF(index);
    return step;

fail_ev:
    Py_DECREF(ev);
fail_index:
    Py_DECREF(index);
    Py_DECREF(step);
    return NULL;
}

static PyObject *
StepLoop_next(StepLoop *self)
{
    if (self->state == LOOP_RUNNING) {
        PyErr_SetString(PyExc_ValueError, "run.steps loop already executing");
        return NULL;
    }
    if (self->state == LOOP_DONE) {
        return NULL;
    }
    self->state = LOOP_RUNNING;
    PyObject *step = self->pending;
    if (step != NULL) {
        self->pending = NULL;
        int rc = end_step(self, step);
        Py_DECREF(step);
        if (rc < 0) {
            self->state = LOOP_DONE;
            return NULL;
        }
    }
    step = start_step(self);
    if (step == NULL) {
        self->state = LOOP_DONE;
        return NULL;
    }
    Py_INCREF(step);
    self->pending = step;
    self->state = LOOP_READY;
    return step;
}

/* Leaving the loop: hold the step in progress until the next run event, so that Run.__exit__
 * can still mark it failed by an exception escaping the loop body (the twin's GeneratorExit). */
static int
StepLoop_close_pending(StepLoop *self)
{
    PyObject *step = self->pending;
    self->state = LOOP_DONE;
    if (step == NULL) {
        return 0;
    }
    self->pending = NULL;
    PyObject *r = PyObject_CallMethodObjArgs(self->rec, s_finish_step, step, Py_None, Py_True,
                                             NULL);
    Py_DECREF(step);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static PyObject *
StepLoop_close(StepLoop *self, PyObject *Py_UNUSED(ignored))
{
    if (self->state == LOOP_RUNNING) {
        PyErr_SetString(PyExc_ValueError, "run.steps loop already executing");
        return NULL;
    }
    if (StepLoop_close_pending(self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static void
StepLoop_finalize(StepLoop *self)
{
    if (self->pending == NULL || self->rec == NULL) {
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (StepLoop_close_pending(self) < 0) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    PyErr_Restore(type, value, tb);
}

static void
StepLoop_dealloc(StepLoop *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return; /* resurrected */
    }
    PyObject_GC_UnTrack(self);
    StepLoop_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef StepLoop_methods[] = {
    {"close", (PyCFunction)StepLoop_close, METH_NOARGS,
     "Leave the loop: the step in progress ends and is held (as break does)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepLoop_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._recorder_c.StepLoop",
    .tp_doc = "The steps of run.steps(): one Step per item, the fetch timed as `data`.",
    .tp_basicsize = sizeof(StepLoop),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = StepLoop_new,
    .tp_dealloc = (destructor)StepLoop_dealloc,
    .tp_finalize = (destructor)StepLoop_finalize,
    .tp_traverse = (traverseproc)StepLoop_traverse,
    .tp_clear = (inquiry)StepLoop_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)StepLoop_next,
    .tp_methods = StepLoop_methods,
};

/* ---- the module ----------------------------------------------------------------------- */

static struct PyModuleDef recorder_c_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "otel_train._recorder_c",
    .m_doc = "The recorder's hot path in C (optional; recorder.py holds its pure-Python twin).",
    .m_size = -1,
};

#define INTERN(var, text)                                 \
    do {                                                  \
        if ((var = PyUnicode_InternFromString(text)) == NULL) \
            return NULL;                                  \
    } while (0)

PyMODINIT_FUNC
PyInit__recorder_c(void)
{
    INTERN(s_ev, "ev");
    INTERN(s_current, "current");
    INTERN(s_error, "error");
    INTERN(s_end_ns, "end_ns");
    INTERN(s_release_held, "release_held");
    INTERN(s_device_step_start, "device_step_start");
    INTERN(s_device_step_end, "device_step_end");
    INTERN(s_drops, "drops");
    INTERN(s_add, "add");
    INTERN(s_span_count, "span_count");
    INTERN(s_finish_step, "finish_step");
    INTERN(s_queue_full, "record_queue_full");
    INTERN(s_outside_error, "_outside_error");
    INTERN(s_ended_error, "_ended_error");
    INTERN(s_append, "append");
    INTERN(s_train_phases, "train_phases");
    INTERN(s_monitor_phases, "monitor_phases");
    if ((one = PyLong_FromLong(1)) == NULL || (zero = PyLong_FromLong(0)) == NULL) {
        return NULL;
    }
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) {
        return NULL;
    }
    perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (perf_counter_ns == NULL) {
        return NULL;
    }
    if (PyType_Ready(&RecorderCore_Type) < 0 || PyType_Ready(&PhaseCore_Type) < 0
        || PyType_Ready(&StepCore_Type) < 0
        || PyType_Ready(&StepLoop_Type) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&recorder_c_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&PhaseCore_Type);
    if (PyModule_AddObject(m, "PhaseCore", (PyObject *)&PhaseCore_Type) < 0) {
        Py_DECREF(&PhaseCore_Type);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RecorderCore_Type);
    if (PyModule_AddObject(m, "RecorderCore", (PyObject *)&RecorderCore_Type) < 0) {
        Py_DECREF(&RecorderCore_Type);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&StepCore_Type);
    if (PyModule_AddObject(m, "StepCore", (PyObject *)&StepCore_Type) < 0) {
        Py_DECREF(&StepCore_Type);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&StepLoop_Type);
    if (PyModule_AddObject(m, "StepLoop", (PyObject *)&StepLoop_Type) < 0) {
        Py_DECREF(&StepLoop_Type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
