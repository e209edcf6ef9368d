/* PhaseCore: a phase's __enter__/__exit__ in C (the base of recorder.Phase). */
#include "_recorder_c.h"

/* ---- PhaseCore ------------------------------------------------------------------------ */

static int
PhaseCore_init(PhaseCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"recorder", "name", "kind", "loader", NULL};
    PyObject *rec, *name, *kind, *loader = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|O:Phase", kwlist, &rec, &name, &kind,
                                     &loader)) {
        return -1;
    }
    if (!PyObject_TypeCheck(rec, &otr_RecorderCore_Type)) {
        PyErr_SetString(PyExc_TypeError, "Phase: recorder must be a recorder.Recorder");
        return -1;
    }
    Py_INCREF(rec);
    Py_XSETREF(self->rec, (RecorderCore *)rec);
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
    return slot_get(self->rec->ev);
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
        PyObject *step = slot_get(self->rec->current);
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

PyTypeObject otr_PhaseCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._recorder_c.PhaseCore",
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
