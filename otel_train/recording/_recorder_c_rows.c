/* flat_phase_rows: a flat step's phase rows in C (twin: step_records._flat_phases).
 *
 * The span worker turns every finished step into a span record off the hot path, but in
 * the training process: its CPU there costs the training thread about as much again, in
 * GIL hand-overs and a shared interpreter (common/self_cost.py). Most steps are flat (their
 * phases ran one after another, none failed), and building their phase rows was most of
 * a record's Python (benchmarks/bench_processors.py measures both twins). Here it is
 * one C call per step; anything but a flat list returns None, and the Python decoder reads
 * it (records/step_records.py).
 */
#include "_recorder_c.h"

/* Interned attribute names of a phase entry that is no C phase (a RingPhase of the step
 * ring): made once, so each read is a lookup, not a string made from C text. */
static PyObject *rows_s_name, *rows_s_kind, *rows_s_loader;

static int
intern_entry_names(void)
{
    if (rows_s_loader != NULL) {
        return 0;
    }
    if ((rows_s_name = PyUnicode_InternFromString("name")) == NULL
        || (rows_s_kind = PyUnicode_InternFromString("kind")) == NULL
        || (rows_s_loader = PyUnicode_InternFromString("loader")) == NULL) {
        Py_CLEAR(rows_s_name);
        Py_CLEAR(rows_s_kind);
        return -1;
    }
    return 0;
}

/* The phase entry's name, kind and loader: the C phase's slots, or attributes elsewhere. */
static int
entry_fields(PyObject *entry, PyObject **name, PyObject **kind, PyObject **loader)
{
    if (PyObject_TypeCheck(entry, &otr_PhaseCore_Type)) {
        PhaseCore *core = (PhaseCore *)entry;
        if (core->name == NULL || core->kind == NULL || core->loader == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "flat_phase_rows: a phase without init");
            return -1;
        }
        *name = core->name;
        *kind = core->kind;
        *loader = core->loader;
        Py_INCREF(*name);
        Py_INCREF(*kind);
        Py_INCREF(*loader);
        return 0;
    }
    *name = *kind = *loader = NULL;
    if (intern_entry_names() < 0) {
        return -1;
    }
    if ((*name = PyObject_GetAttr(entry, rows_s_name)) == NULL
        || (*kind = PyObject_GetAttr(entry, rows_s_kind)) == NULL
        || (*loader = PyObject_GetAttr(entry, rows_s_loader)) == NULL) {
        Py_XDECREF(*name);
        Py_XDECREF(*kind);
        return -1;
    }
    return 0;
}

/* 1 if `ev` (a tuple) is a flat event list, 0 if not, -1 on error: as
 * step_events.flat_events reads it, entries that are no int, int end times, and nothing
 * true (no exception) at each exit. */
static int
is_flat(PyObject *ev)
{
    Py_ssize_t n = PyTuple_GET_SIZE(ev);
    if (n & 3) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i += 4) {
        PyObject **item = &PyTuple_GET_ITEM(ev, i);
        if (PyLong_CheckExact(item[0]) || !PyLong_CheckExact(item[2])) {
            return 0;
        }
        if (item[3] != Py_None) {
            int failed = PyObject_IsTrue(item[3]);
            if (failed != 0) {
                return failed < 0 ? -1 : 0;
            }
        }
    }
    return 1;
}


void
otr_entry_cache_clear(EntryCache *cache)
{
    for (int i = 0; i < cache->n; i++) {
        Py_DECREF(cache->e[i].entry);
        Py_DECREF(cache->e[i].name);
        Py_DECREF(cache->e[i].kind);
        Py_DECREF(cache->e[i].loader);
    }
    cache->n = 0;
}

/* The entry's name, kind and own loader (new references), whether its loader is true,
 * whether it is a data phase without a loader of its own and whether its name is data_name
 * (`named`: NULL where not asked): from `cache` when it holds the entry (NULL: none). */
int
otr_entry_row_fields(EntryCache *cache, PyObject *entry, PyObject *data_name, PyObject **name,
                 PyObject **kind, PyObject **own_loader, int *own, int *data, int *named)
{
    if (cache != NULL) {
        for (int i = 0; i < cache->n; i++) {
            EntryFields *ef = &cache->e[i];
            if (ef->entry == entry) {
                *name = ef->name;
                *kind = ef->kind;
                *own_loader = ef->loader;
                Py_INCREF(*name);
                Py_INCREF(*kind);
                Py_INCREF(*own_loader);
                *own = ef->own;
                *data = ef->data;
                if (named != NULL) {
                    *named = ef->named_data;
                }
                return 0;
            }
        }
    }
    if (entry_fields(entry, name, kind, own_loader) < 0) {
        return -1;
    }
    /* As decoded: only data spans carry a loader; the kind is the phase's own. */
    *own = PyObject_IsTrue(*own_loader);
    int is_data = *own < 0 ? -1 : PyObject_RichCompareBool(*name, data_name, Py_EQ);
    *data = *own ? 0 : is_data;
    if (named != NULL) {
        *named = is_data;
    }
    if (*own < 0 || is_data < 0) {
        Py_DECREF(*name);
        Py_DECREF(*kind);
        Py_DECREF(*own_loader);
        return -1;
    }
    if (cache != NULL && cache->n < ENTRY_CACHE_SIZE) {
        EntryFields *ef = &cache->e[cache->n++];
        ef->entry = entry;
        ef->name = *name;
        ef->kind = *kind;
        ef->loader = *own_loader;
        Py_INCREF(entry);
        Py_INCREF(*name);
        Py_INCREF(*kind);
        Py_INCREF(*own_loader);
        ef->own = *own;
        ef->data = *data;
        ef->named_data = is_data;
    }
    return 0;
}

/* One phase's row (span_rows.py's layout), a new reference or NULL. */
PyObject *
otr_phase_row(PyObject **item, Py_ssize_t ordinal, PyObject *step_loader, PyObject *root_id,
          PyObject *offset, PyObject *data_name, EntryCache *cache)
{
    PyObject *name, *kind, *own_loader, *row = NULL;
    int own, data;
    if (otr_entry_row_fields(cache, item[0], data_name, &name, &kind, &own_loader, &own,
                         &data, NULL) < 0) {
        return NULL;
    }
    PyObject *ord = NULL, *duration = NULL, *start = NULL, *end = NULL, *loader = NULL;
    loader = own ? own_loader : data ? step_loader : Py_None;
    Py_INCREF(loader);
    if ((duration = PyNumber_Subtract(item[2], item[1])) == NULL
        || (ord = PyLong_FromSsize_t(ordinal)) == NULL
        || (start = PyNumber_Add(item[1], offset)) == NULL
        || (end = PyNumber_Add(item[2], offset)) == NULL) {
        goto done;
    }
    PyObject *no_events = PyTuple_New(0);
    if (no_events == NULL) {
        goto done;
    }
    row = PyTuple_Pack(12, name, kind, loader, duration, ord, root_id, start, end, Py_None,
                       no_events, Py_None, Py_None);
    Py_DECREF(no_events);
done:
    Py_DECREF(name);
    Py_DECREF(kind);
    Py_DECREF(own_loader);
    Py_XDECREF(loader);
    Py_XDECREF(duration);
    Py_XDECREF(ord);
    Py_XDECREF(start);
    Py_XDECREF(end);
    return row;
}

static PyObject *flat_phase_rows_impl(PyObject *const *args, EntryCache *cache);

/* flat_phase_rows(ev, step_loader, root_id, offset_ns, data_name) -> list | None */
PyObject *
otr_flat_phase_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "flat_phase_rows(ev, step_loader, root_id, offset_ns, data_name)");
        return NULL;
    }
    return flat_phase_rows_impl(args, NULL);
}

static PyObject *
flat_phase_rows_impl(PyObject *const *args, EntryCache *cache)
{
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "flat_phase_rows: ev must be a list");
        return NULL;
    }
    /* A snapshot: the rows are made from items it owns, whatever a getattr runs. */
    PyObject *ev = PyList_AsTuple(args[0]);
    if (ev == NULL) {
        return NULL;
    }
    int flat = is_flat(ev);
    if (flat <= 0) {
        Py_DECREF(ev);
        if (flat < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    Py_ssize_t phases = PyTuple_GET_SIZE(ev) / 4;
    PyObject *rows = PyList_New(phases);
    for (Py_ssize_t k = 0; rows != NULL && k < phases; k++) {
        PyObject *row = otr_phase_row(&PyTuple_GET_ITEM(ev, 4 * k), k + 1, args[1], args[2],
                                  args[3], args[4], cache);
        if (row == NULL) {
            Py_CLEAR(rows);
            break;
        }
        PyList_SET_ITEM(rows, k, row);
    }
    Py_DECREF(ev);
    return rows;
}

/* flat_step_record: a flat step's whole span record (twin: step_records._step_record's
 * common case, which decides when it applies: no device readings, rare fields, own timing,
 * memory reading, collectives, nor a step's own exposed communication time). The phase
 * rows as flat_phase_rows makes them; the root's attributes in the Python builder's order:
 * step, dataloader (when the step has one), train.slow False, then train.step.bound from
 * the host clock alone (device_readings.label_step with no device time: `input` when the
 * data phases took the share of the step's wall time, else the carried verdict or
 * `compute`). Python numbers throughout, so any int the step holds compares and subtracts
 * exactly as in Python. */

/* The record's root attributes, or NULL. `c`: the constants tuple (see below). */
PyObject *
otr_flat_root_attributes(PyObject *const *args, PyObject *rows, PyObject *const *c)
{
    /* c: data_name, step_key, loader_key, slow_key, bound_key, input, compute, share */
    PyObject *attrs = PyDict_New(), *data_ns = NULL, *wall = NULL, *cut = NULL;
    if (attrs == NULL || PyDict_SetItem(attrs, c[1], args[2]) < 0
        || (args[1] != Py_None && PyDict_SetItem(attrs, c[2], args[1]) < 0)
        || PyDict_SetItem(attrs, c[3], Py_False) < 0) {
        goto fail;
    }
    data_ns = otr_zero;
    Py_INCREF(data_ns);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        int data = PyObject_RichCompareBool(PyTuple_GET_ITEM(row, 0), c[0], Py_EQ);
        if (data < 0) {
            goto fail;
        }
        if (data) {
            PyObject *sum = PyNumber_Add(data_ns, PyTuple_GET_ITEM(row, 3));
            if (sum == NULL) {
                goto fail;
            }
            Py_SETREF(data_ns, sum);
        }
    }
    /* data_ns >= share * wall_ns > 0, as Python compares an int with a float: exactly */
    if ((wall = PyNumber_Subtract(args[4], args[3])) == NULL
        || (cut = PyNumber_Multiply(c[7], wall)) == NULL) {
        goto fail;
    }
    int input = PyObject_RichCompareBool(data_ns, cut, Py_GE);
    if (input > 0) {
        input = PyObject_RichCompareBool(cut, otr_zero, Py_GT);
    }
    if (input < 0) {
        goto fail;
    }
    PyObject *last = args[9];
    PyObject *bound = input ? c[5] : last != Py_None ? last : c[6];
    if (input == 0 && last != Py_None) {
        int truthy = PyObject_IsTrue(last); /* `last_device_bound or compute` */
        if (truthy < 0) {
            goto fail;
        }
        bound = truthy ? last : c[6];
    }
    if (PyDict_SetItem(attrs, c[4], bound) < 0) {
        goto fail;
    }
    Py_DECREF(data_ns);
    Py_DECREF(wall);
    Py_DECREF(cut);
    return attrs;
fail:
    Py_XDECREF(attrs);
    Py_XDECREF(data_ns);
    Py_XDECREF(wall);
    Py_XDECREF(cut);
    return NULL;
}


/* flat_step_record(ev, step_loader, index, start_ns, end_ns, trace_id, flags, root_id,
 *                  offset_ns, last_bound, span_name, constants) -> tuple | None */
PyObject *
otr_flat_step_record(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12 || !PyTuple_Check(args[11]) || PyTuple_GET_SIZE(args[11]) != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "flat_step_record(ev, step_loader, index, start_ns, end_ns, trace_id, "
                        "flags, root_id, offset_ns, last_bound, span_name, constants[8])");
        return NULL;
    }
    return otr_flat_step_record_impl(args, NULL);
}

PyObject *
otr_flat_step_record_impl(PyObject *const *args, EntryCache *cache)
{
    PyObject *const *c = &PyTuple_GET_ITEM(args[11], 0);
    PyObject *row_args[5] = {args[0], args[1], args[7], args[8], c[0]};
    PyObject *rows = flat_phase_rows_impl(row_args, cache);
    if (rows == NULL || rows == Py_None) {
        return rows;
    }
    PyObject *attrs = otr_flat_root_attributes(args, rows, c);
    PyObject *start = NULL, *end = NULL, *events = NULL, *rec = NULL;
    if (attrs != NULL && (start = PyNumber_Add(args[3], args[8])) != NULL
        && (end = PyNumber_Add(args[4], args[8])) != NULL
        && (events = PyTuple_New(0)) != NULL) {
        rec = PyTuple_Pack(11, args[10], args[5], args[7], args[6], start, end, attrs, Py_None,
                           events, rows, Py_None);
    }
    Py_DECREF(rows);
    Py_XDECREF(attrs);
    Py_XDECREF(start);
    Py_XDECREF(end);
    Py_XDECREF(events);
    return rec;
}
