/* StepLoop: run.steps in C (what Recorder.steps returns). */
#include "_recorder_c.h"

/* ---- StepLoop ------------------------------------------------------------------------- */

enum { LOOP_READY, LOOP_RUNNING, LOOP_DONE };

typedef struct {
    PyObject_HEAD
    PyObject *rec;
    PyObject *iterable;       /* until the first step's data phase makes `it` of it */
    PyObject *it;
    PyObject *loader;
    PyObject *data;           /* the data Phase: it opens with each step */
    PyObject *step_type;      /* recorder.Step */
    PyObject *nested_error;   /* recorder._nested(step) -> RuntimeError */
    PyObject *sync;           /* recorder.synchronize (device_sync) or None */
    PyObject *pending;        /* the step last returned, until the next __next__ or close */
    PyObject *empty;          /* () for Step.__new__ */
    PyObject *counter;        /* the run's BatchCounter (step_counts.py), or NULL */
    PyObject *on_batch;       /* its bound on_batch, called after each fetch */
    Py_ssize_t left;          /* steps this loop may still start (max_steps); -1: no limit */
    int plain;                /* host clock only: no device_step_start/_end calls */
    int state;
} StepLoop;

static int
StepLoop_traverse(StepLoop *self, visitproc visit, void *arg)
{
    Py_VISIT(self->rec);
    Py_VISIT(self->iterable);
    Py_VISIT(self->it);
    Py_VISIT(self->loader);
    Py_VISIT(self->data);
    Py_VISIT(self->step_type);
    Py_VISIT(self->nested_error);
    Py_VISIT(self->sync);
    Py_VISIT(self->pending);
    Py_VISIT(self->counter);
    Py_VISIT(self->on_batch);
    return 0;
}

static int
StepLoop_clear(StepLoop *self)
{
    Py_CLEAR(self->rec);
    Py_CLEAR(self->iterable);
    Py_CLEAR(self->it);
    Py_CLEAR(self->loader);
    Py_CLEAR(self->data);
    Py_CLEAR(self->step_type);
    Py_CLEAR(self->nested_error);
    Py_CLEAR(self->sync);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->counter);
    Py_CLEAR(self->on_batch);
    return 0;
}

static PyObject *
StepLoop_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"recorder", "iterable", "loader", "data_phase", "step_type",
                             "nested_error", "max_steps", "counter", NULL};
    PyObject *rec, *iterable, *loader, *data, *step_type, *nested_error;
    PyObject *max_steps = Py_None, *counter = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO|OO:StepLoop", kwlist, &rec, &iterable,
                                     &loader, &data, &step_type, &nested_error, &max_steps,
                                     &counter)) {
        return NULL;
    }
    Py_ssize_t left = -1;
    if (max_steps != Py_None) { /* Recorder.steps validated it: a positive int */
        left = PyNumber_AsSsize_t(max_steps, PyExc_OverflowError);
        if (left == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (left < 0) {
            PyErr_SetString(PyExc_ValueError, "StepLoop: max_steps must be >= 0 or None");
            return NULL;
        }
    }
    if (!PyType_Check(step_type)
        || !PyType_IsSubtype((PyTypeObject *)step_type, &otr_StepCore_Type)) {
        PyErr_SetString(PyExc_TypeError, "StepLoop: step_type must be a StepCore subclass");
        return NULL;
    }
    if (!PyObject_TypeCheck(rec, &otr_RecorderCore_Type)) {
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
    Py_INCREF(iterable);
    self->iterable = iterable; /* iter() runs in the first step's data phase */
    self->left = left;
    if (counter != Py_None) {
        Py_INCREF(counter);
        self->counter = counter;
        self->on_batch = PyObject_GetAttr(counter, s_on_batch);
        if (self->on_batch == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    self->state = LOOP_READY;
    self->empty = PyTuple_New(0);
    if (self->empty == NULL) {
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

/* The counter's loop_mode (0, 1 or 2), or -1 with an error set. */
static long
counter_mode(PyObject *counter)
{
    PyObject *mode = PyObject_GetAttr(counter, s_loop_mode);
    if (mode == NULL) {
        return -1;
    }
    long value = PyLong_AsLong(mode);
    Py_DECREF(mode);
    return value;
}

/* Ends `step` as Recorder.finish_step's usual path does, unless the loop body ended it. */
static int
end_step(StepLoop *self, PyObject *step)
{
    PyObject *rec = self->rec;
    StepCore *core = (StepCore *)step;
    int was_ended = otr_step_ended(core);
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
    if (rc->ring != NULL && rc->ring != Py_None) {
        /* The step ring: a flat step's record goes to shared memory, not the queue. */
        int carried = Py_IS_TYPE(rc->ring, &otr_RingWriterCore_Type)
                          ? otr_ring_write(rc->ring, step)
                          : -2;
        if (carried == -2) {
            PyObject *r = PyObject_CallMethod(rc->ring, "write_step", "O", step);
            carried = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
        }
        if (carried < 0) {
            /* Never raised into training: the queue takes the step (built as before). */
            PyErr_Clear();
        }
        else if (carried > 0) {
            return 0;
        }
    }
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
    PyObject *next = PyNumber_Add(index, otr_one);
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

    if (self->it == NULL) {
        /* In the data phase: a DataLoader starts its workers here, before its first batch. */
        self->it = PyObject_GetIter(self->iterable);
        if (self->it == NULL) {
            fetch_failed(self, step, ev);
            goto fail_ev;
        }
        Py_CLEAR(self->iterable);
    }
    /* The batch counter's work this step (its loop_mode: 0 none, 1 count the batch after
     * the fetch, 2 also end the open FLOP count before it), read once a step. */
    long count_mode = self->counter != NULL ? counter_mode(self->counter) : 0;
    if (count_mode < 0) {
        fetch_failed(self, step, ev);
        goto fail_ev;
    }
    if (count_mode == 2) {
        PyObject *r = PyObject_CallMethodOneArg(self->counter, s_before_fetch, step);
        if (r == NULL) {
            fetch_failed(self, step, ev);
            goto fail_ev;
        }
        Py_DECREF(r);
    }
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
    if (count_mode > 0) {
        /* train.tokens / train.samples of the batch, after the data phase: the loader's
         * time is the data phase's; the counter times its own work (own cost). */
        PyObject *args[2] = {step, batch};
        PyObject *r = PyObject_Vectorcall(self->on_batch, args, 2, NULL);
        if (r == NULL) {
            Py_DECREF(batch);
            goto fail_ev;
        }
        Py_DECREF(r);
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

/* The loop is over: let go of the loader's iterator now (a DataLoader's shuts down its
 * workers), outside any step, as the generator twin's frame does when it returns. */
static void
StepLoop_done(StepLoop *self)
{
    self->state = LOOP_DONE;
    Py_CLEAR(self->iterable);
    Py_CLEAR(self->it);
    if (self->counter != NULL) {
        /* A FLOP count still open ends with the loop, onto no step (lost). */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (counter_mode(self->counter) == 2) {
            PyObject *r = PyObject_CallMethodOneArg(self->counter, s_before_fetch, Py_None);
            Py_XDECREF(r);
        }
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        Py_CLEAR(self->counter);
        Py_CLEAR(self->on_batch);
    }
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
            StepLoop_done(self);
            return NULL;
        }
    }
    if (self->left == 0) { /* max_steps reached: no fetch of another item */
        StepLoop_done(self);
        return NULL;
    }
    if (self->left > 0) {
        self->left--;
    }
    step = start_step(self);
    if (step == NULL) {
        StepLoop_done(self);
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
    self->pending = NULL;
    self->state = LOOP_DONE;
    int rc = 0;
    if (step != NULL) {
        PyObject *r = PyObject_CallMethodObjArgs(self->rec, s_finish_step, step, Py_None,
                                                 Py_True, NULL);
        Py_DECREF(step);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    StepLoop_done(self); /* after the step's end: the iterator's teardown is in no step */
    return rc;
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

PyTypeObject otr_StepLoop_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._recorder_c.StepLoop",
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
