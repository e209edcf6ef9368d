/* StepCore: a step's fields and phase lookups in C (the base of recorder.Step). */
#include "_recorder_c.h"

/* ---- StepCore ------------------------------------------------------------------------ */

/* The fields every step has, in C slots (no instance-dict stores on the hot path), and the
 * phase lookups, which refuse once the step has ended. recorder.Step adds the rest. The
 * struct is in _recorder_c.h: the step loop writes its slots directly. */

static PyObject *
StepCore_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    StepCore *self = (StepCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    /* The twin's class defaults: not ended, no batch, no error. */
    Py_INCREF(otr_zero);
    self->end_ns = otr_zero;
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
int
otr_step_ended(StepCore *self)
{
    PyObject *end = self->end_ns;
    if (end == otr_zero || end == NULL) {
        return 0;
    }
    return PyObject_IsTrue(end);
}

/* The Phase `name` of the recorder's table `table` (train or monitor), or the error of a
 * phase opened on an ended step. */
static PyObject *
step_lookup(StepCore *self, PyObject *name, PyObject *table)
{
    int ended = otr_step_ended(self);
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

PyTypeObject otr_StepCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._recorder_c.StepCore",
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
