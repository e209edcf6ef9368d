/* Shared by the C accelerator's sources (see _recorder_c.c for what it is and why). */
#ifndef OTEL_TRAIN_RECORDER_C_H
#define OTEL_TRAIN_RECORDER_C_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#if defined(__linux__)
#include <time.h>
#endif

/* Interned attribute and method names, and constants (defined in _recorder_c.c). */
extern PyObject *s_error, *s_end_ns, *s_release_held, *s_device_step_start,
    *s_device_step_end, *s_drops, *s_add, *s_span_count, *s_finish_step, *s_queue_full,
    *s_outside_error, *s_ended_error, *s_append, *s_train_phases,
    *s_monitor_phases, *s_loop_mode, *s_on_batch, *s_before_fetch;
extern PyObject *otr_perf_counter_ns; /* time.perf_counter_ns, where no direct clock is used */
extern PyObject *otr_one;             /* 1, for next_index + 1 */
extern PyObject *otr_zero;            /* 0: a step's end_ns until it ends */

extern PyTypeObject otr_RecorderCore_Type, otr_PhaseCore_Type, otr_StepCore_Type,
    otr_StepLoop_Type, otr_RingWriterCore_Type, otr_RingStep_Type;

/* The recorder's hot fields (see _recorder_c.c). */
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
    PyObject *ring;             /* the step ring's writer (_recorder_c_ring.c), or None */
} RecorderCore;

/* A phase's fields (see _recorder_c_phase.c; _recorder_c_rows.c reads them too). */
typedef struct {
    PyObject_HEAD
    RecorderCore *rec; /* its slots read directly at every boundary */
    PyObject *name;
    PyObject *kind;
    PyObject *loader;
} PhaseCore;

/* A step's fields (see _recorder_c_step.c). */
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

/* A flat step read back from the step ring (_recorder_c_ringread.c): its phases' entries
 * and times kept in C, the event list made only when `ev` is read; flat_step_records
 * (_recorder_c_rows.c) builds its record from these fields. */
typedef struct {
    PyObject *phase; /* the RingPhase (strong reference) */
    long long start_ns, end_ns;
} RingStepPhase;

typedef struct {
    PyObject_VAR_HEAD /* ob_size: its phases */
    long long index, start_ns, end_ns;
    PyObject *loader; /* str or None */
    PyObject *attrs;  /* dict, or NULL: None */
    PyObject *ev;     /* the event list once read, else NULL */
    RingStepPhase phases[1];
} RingStepCore;

/* A new reference to perf_counter_ns() as an int, or NULL with an exception set. */
static inline PyObject *
clock_ns(void)
{
#if defined(__linux__)
    /* CPython's perf_counter_ns on Linux: clock_gettime(CLOCK_MONOTONIC), in ns. */
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
        return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    }
#endif
    return PyObject_CallNoArgs(otr_perf_counter_ns);
}

/* Sets the exception that `factory(arg)` returns (a Python helper builds the message). */
static inline void
raise_from_factory(PyObject *factory, PyObject *arg)
{
    PyObject *exc = PyObject_CallOneArg(factory, arg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

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

/* 1 if the step has ended, 0 if not, -1 on error (_recorder_c_step.c). */
int otr_step_ended(StepCore *self);

/* 1: the step ring carried `step`, 0: not, -1: error (_recorder_c_ring.c). */
int otr_ring_write(PyObject *writer, PyObject *step);

/* A flat step's phase rows, or None (_recorder_c_rows.c). */
PyObject *otr_flat_phase_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* A flat step's whole span record, or None (_recorder_c_rows.c). */
PyObject *otr_flat_step_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* What _recorder_c_ringrows.c builds ring steps' records with (_recorder_c_rows.c). */
/* A phase entry's fields as a row reads them, kept through one flat_step_records call
 * (a run's steps share their phase entries: each is read once a call, not once a step). */
#define ENTRY_CACHE_SIZE 32
typedef struct {
    PyObject *entry, *name, *kind, *loader; /* strong references */
    int own;                                /* the entry's loader is true */
    int data;                               /* no own loader, and its name is data_name */
    int named_data;                         /* its name equals data_name */
} EntryFields;

typedef struct {
    EntryFields e[ENTRY_CACHE_SIZE];
    int n;
} EntryCache;
void otr_entry_cache_clear(EntryCache *cache);
/* A phase entry's row fields (new references), from `cache` when it holds the entry. */
int otr_entry_row_fields(EntryCache *cache, PyObject *entry, PyObject *data_name,
                         PyObject **name, PyObject **kind, PyObject **own_loader, int *own,
                         int *data, int *named);
/* One phase's row (span_rows.py's layout), a new reference or NULL. */
PyObject *otr_phase_row(PyObject **item, Py_ssize_t ordinal, PyObject *step_loader,
                        PyObject *root_id, PyObject *offset, PyObject *data_name,
                        EntryCache *cache);
/* A flat step's record's root attributes, or NULL. */
PyObject *otr_flat_root_attributes(PyObject *const *args, PyObject *rows, PyObject *const *c);
/* flat_step_record's body, reading phase entries through `cache` (NULL: none). */
PyObject *otr_flat_step_record_impl(PyObject *const *args, EntryCache *cache);

/* A batch of ring steps' records (_recorder_c_ringrows.c). */
PyObject *otr_flat_step_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* A ring step's trace id (_recorder_c_ringids.c): of an int `index` (NULL, no error set,
 * for one that is no int within 64 bits), of a C value, and the module's ring_trace_id. */
PyObject *otr_ring_trace_id_index(PyObject *head, PyObject *index);
PyObject *otr_ring_trace_id_of(PyObject *head, long long value);
PyObject *otr_ring_trace_id(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* Built records' warm and cold spans and latest end (_recorder_c_ringrows.c). */
PyObject *otr_ring_span_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* The step ring's records read from its bytes (see _recorder_c_ringread.c). */
PyObject *otr_ring_read_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
