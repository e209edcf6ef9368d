/* flat_step_records: a run of ring steps' span records in one call (twin:
 * step_records.StepRecordBuilder.step_records), their trace ids hashed through hashlib's
 * blake2b object from C, and ring_span_counts: the built records' warm and cold spans.
 *
 * The exporter process builds every step the ring carries (export/process/ring_build.py):
 * a ring step's phases are read from the C reader's fields (_recorder_c_ringread.c) with
 * int64 arithmetic, and whatever that can't hold exactly goes through flat_step_record's
 * general path (_recorder_c_rows.c), which reads Python numbers.
 */
#include "_recorder_c.h"

static PyObject *rows_s_error, *rows_s_dev, *rows_s_phase_attrs, *rows_s_queued_waits,
    *rows_s_span_ids, *rows_s_trace_id, *rows_s_attrs, *rows_s_ev, *rows_s_index,
    *rows_s_start_ns, *rows_s_end_ns, *rows_s_step_loader;

static int
intern_step_names(void)
{
    if (rows_s_step_loader != NULL) {
        return 0;
    }
    struct { PyObject **var; const char *text; } names[] = {
        {&rows_s_error, "error"}, {&rows_s_dev, "dev"}, {&rows_s_phase_attrs, "phase_attrs"},
        {&rows_s_queued_waits, "queued_waits"}, {&rows_s_span_ids, "span_ids"},
        {&rows_s_trace_id, "trace_id"}, {&rows_s_attrs, "attrs"}, {&rows_s_ev, "ev"},
        {&rows_s_index, "index"}, {&rows_s_start_ns, "start_ns"}, {&rows_s_end_ns, "end_ns"},
        {&rows_s_step_loader, "loader"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].var == NULL
            && (*names[i].var = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    return 0;
}

/* 1 when the step's attribute `name` is None, False, 0 or empty; 0 if not; -1 on error. */
static int
attr_empty(PyObject *step, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(step, name);
    if (v == NULL) {
        return -1;
    }
    int truth = v == Py_None ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth < 0 ? -1 : !truth;
}

/* ---- the C reader's RingStep built from its C fields ------------------------------------ */

/* A phase row of a RingStep (span_rows.py's layout, as otr_phase_row makes it of the event
 * list), from C numbers; NULL on error. `named`: its name is data_name. `same_start`: an
 * int equal to `start` to share (the step's start: its data phase opens with it), or NULL. */
static PyObject *
ring_phase_row(RingStepPhase *ph, Py_ssize_t ordinal, long long duration, long long start,
               long long end, PyObject *step_loader, PyObject *root_id, PyObject *data_name,
               EntryCache *cache, int *named, PyObject *same_start)
{
    PyObject *name, *kind, *own_loader;
    int own, data;
    if (otr_entry_row_fields(cache, ph->phase, data_name, &name, &kind, &own_loader, &own, &data,
                         named) < 0) {
        return NULL;
    }
    PyObject *loader = own ? own_loader : data ? step_loader : Py_None;
    Py_INCREF(loader);
    Py_DECREF(own_loader);
    PyObject *row = PyTuple_New(12);
    if (same_start != NULL) {
        Py_INCREF(same_start);
    }
    PyObject *nums[4] = {PyLong_FromLongLong(duration), PyLong_FromSsize_t(ordinal),
                         same_start ? same_start : PyLong_FromLongLong(start),
                         PyLong_FromLongLong(end)};
    PyObject *no_events = PyTuple_New(0);
    if (row == NULL || no_events == NULL || !nums[0] || !nums[1] || !nums[2] || !nums[3]) {
        Py_XDECREF(row);
        Py_XDECREF(no_events);
        for (int i = 0; i < 4; i++) {
            Py_XDECREF(nums[i]);
        }
        Py_DECREF(name);
        Py_DECREF(kind);
        Py_DECREF(loader);
        return NULL;
    }
    Py_INCREF(root_id);
    PyObject *items[12] = {name, kind, loader, nums[0], nums[1], root_id, nums[2], nums[3],
                           Py_None, no_events, Py_None, Py_None};
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    for (int i = 0; i < 12; i++) {
        PyTuple_SET_ITEM(row, i, items[i]);  /* steals each */
    }
    /* Strings, ints, None and the empty tuple: the row can be in no cycle, so the GC need
     * not track it (its first collection would untrack it, after walking it); the records
     * wait in queues through many collections. */
    PyObject_GC_UnTrack(row);
    return row;
}

/* `input` of the host clock's bound (otr_flat_root_attributes' `data_ns >= share * wall_ns > 0`)
 * from C numbers, where they compare exactly as Python's int and float: 1 or 0, -1 where
 * they may not (the general path decides). */
static int
ring_input_bound(long long data_ns, long long wall_ns, PyObject *share)
{
    const long long exact = 1LL << 53; /* a double holds every int up to this */
    if (!PyFloat_CheckExact(share) || data_ns > exact || data_ns < -exact) {
        return -1;
    }
    /* Python's float * int rounds the int to the nearest double, as this cast does */
    double cut = PyFloat_AS_DOUBLE(share) * (double)wall_ns;
    return (double)data_ns >= cut && cut > 0.0;
}

/* The root attributes of a RingStep's record (otr_flat_root_attributes' order and values);
 * NULL on error. */
static PyObject *
ring_root_attributes(PyObject *index, PyObject *loader, int input, PyObject *last,
                     PyObject *const *c)
{
    PyObject *bound = input ? c[5] : c[6];
    if (!input && last != Py_None) {
        int truthy = PyObject_IsTrue(last); /* `last_device_bound or compute` */
        if (truthy < 0) {
            return NULL;
        }
        bound = truthy ? last : c[6];
    }
    PyObject *attrs = PyDict_New();
    if (attrs == NULL || PyDict_SetItem(attrs, c[1], index) < 0
        || (loader != Py_None && PyDict_SetItem(attrs, c[2], loader) < 0)
        || PyDict_SetItem(attrs, c[3], Py_False) < 0
        || PyDict_SetItem(attrs, c[4], bound) < 0) {
        Py_XDECREF(attrs);
        return NULL;
    }
    return attrs;
}

/* The phase rows of RingStep `s`, its data phases' time summed into `*data_ns`: a new
 * list, Py_None (a new reference) where a number leaves int64 (the general path builds
 * it), NULL on error. `step_start`: the record's start, shared by a phase starting then. */
static PyObject *
ring_phase_rows(RingStepCore *s, PyObject *root_id, long long off, PyObject *data_name,
                EntryCache *cache, long long *data_ns, PyObject *step_start)
{
    Py_ssize_t n = Py_SIZE(s);
    long long start, end, duration, sum = 0;
    for (Py_ssize_t k = 0; k < n; k++) {  /* every number first: none made in vain */
        RingStepPhase *ph = &s->phases[k];
        if (__builtin_sub_overflow(ph->end_ns, ph->start_ns, &duration)
            || __builtin_add_overflow(ph->start_ns, off, &start)
            || __builtin_add_overflow(ph->end_ns, off, &end)) {
            Py_RETURN_NONE;
        }
    }
    PyObject *rows = PyList_New(n);
    for (Py_ssize_t k = 0; rows != NULL && k < n; k++) {
        RingStepPhase *ph = &s->phases[k];
        int named = 0;
        duration = ph->end_ns - ph->start_ns;
        PyObject *row = ring_phase_row(ph, k + 1, duration, ph->start_ns + off,
                                       ph->end_ns + off, s->loader, root_id, data_name, cache,
                                       &named, ph->start_ns == s->start_ns ? step_start : NULL);
        if (row == NULL) {
            Py_CLEAR(rows);
            break;
        }
        PyList_SET_ITEM(rows, k, row);
        if (named && __builtin_add_overflow(sum, duration, &sum)) {
            Py_DECREF(rows);
            Py_RETURN_NONE;
        }
    }
    *data_ns = sum;
    return rows;
}

/* The record of RingStep `s` (the C reader's, its event list never read, no attributes)
 * from its C fields, as flat_step_record makes it of its event list, appended to `out`:
 * 1; 0 where a number leaves the range this computes exactly (the general path builds
 * it); -1 for a step the caller builds (an error may be set); -2 on a failed append.
 * `a`: flat_step_records' arguments. */
static int
ring_step_record(RingStepCore *s, PyObject *const *a, PyObject *root_id, long long off,
                 long long rss_every, EntryCache *cache, PyObject *out)
{
    PyObject *const *c = &PyTuple_GET_ITEM(a[8], 0);
    long long start, end, wall, data_ns = 0;
    if (rss_every > 0 && s->index % rss_every == 0) {
        return -1;  /* its root reads the host's memory: Python's */
    }
    if (__builtin_add_overflow(s->start_ns, off, &start)
        || __builtin_add_overflow(s->end_ns, off, &end)
        || __builtin_sub_overflow(s->end_ns, s->start_ns, &wall)) {
        return 0;
    }
    PyObject *t0 = PyLong_FromLongLong(start);
    PyObject *rows = t0 ? ring_phase_rows(s, root_id, off, c[0], cache, &data_ns, t0) : NULL;
    if (rows == NULL || rows == Py_None) {
        Py_XDECREF(t0);
        Py_XDECREF(rows);
        return rows == NULL ? -1 : 0;
    }
    int input = ring_input_bound(data_ns, wall, c[7]);
    if (input < 0) {
        Py_DECREF(t0);
        Py_DECREF(rows);
        return 0;
    }
    int rc = -1;
    PyObject *index = PyLong_FromLongLong(s->index), *trace = NULL, *flags = NULL,
             *attrs = NULL, *t1 = NULL, *events = NULL, *rec = NULL;
    if (index == NULL || (trace = otr_ring_trace_id_of(a[3], s->index)) == NULL) {
        goto done;
    }
    if (a[4] == Py_None) {
        flags = otr_one;
        Py_INCREF(flags);
    }
    else {
        PyObject *sampled = PyObject_CallOneArg(a[4], trace);
        int yes = sampled == NULL ? -1 : PyObject_IsTrue(sampled);
        Py_XDECREF(sampled);
        if (yes < 0) {
            goto done;
        }
        flags = yes ? otr_one : otr_zero;
        Py_INCREF(flags);
    }
    if ((attrs = ring_root_attributes(index, s->loader, input, a[6], c)) == NULL
        || (t1 = PyLong_FromLongLong(end)) == NULL
        || (events = PyTuple_New(0)) == NULL
        || (rec = PyTuple_Pack(11, a[7], trace, root_id, flags, t0, t1, attrs, Py_None, events,
                               rows, Py_None)) == NULL) {
        goto done;
    }
    rc = PyList_Append(out, rec) < 0 ? -2 : 1;
done:
    Py_DECREF(rows);
    Py_XDECREF(index);
    Py_XDECREF(trace);
    Py_XDECREF(flags);
    Py_XDECREF(attrs);
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    Py_XDECREF(events);
    Py_XDECREF(rec);
    return rc;
}

/* flat_step_records(steps, start, root_ids, trace_head, is_sampled, offset_ns,
 *                   last_bound, span_name, constants, out, rss_every, ids_at) -> int
 *
 * From steps[start] on, each step's record as flat_step_record makes it, appended to
 * `out`, its trace id made here (ring_trace_id) and its root span id taken from root_ids
 * in turn from root_ids[ids_at]; stops at the first step it does not build (its index is returned; len(steps)
 * when all were): a step with an error, device readings, phase attributes, queued waits,
 * span ids or a trace id of its own, attributes, an index that is no 64-bit int or a
 * multiple of rss_every (> 0: its root reads the host's memory), or a list of events that
 * is not flat, or anything that fails on it. The caller (StepRecordBuilder.step_records) builds that one
 * in Python and calls again from the next; it passes only steps whose class cannot hold
 * the watchdog's or the schedule's events, with the run-wide conditions met.
 * is_sampled: the builder's callable (called with each trace id), or None: all sampled. */
PyObject *
otr_flat_step_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12 || !PyList_Check(args[0]) || !PyList_Check(args[2])
        || !PyList_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError,
                        "flat_step_records(steps: list, start, root_ids: list, trace_head, "
                        "is_sampled, offset_ns, last_bound, span_name, constants, "
                        "out: list, rss_every: int, ids_at: int)");
        return NULL;
    }
    long long rss_every = PyLong_AsLongLong(args[10]);
    if (rss_every == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t used = PyLong_AsSsize_t(args[11]);  /* root ids taken so far */
    if (used == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (used < 0) {
        used = 0;
    }
    if (intern_step_names() < 0) {
        return NULL;
    }
    if (!PyTuple_Check(args[8]) || PyTuple_GET_SIZE(args[8]) != 8) {
        PyErr_SetString(PyExc_TypeError, "flat_step_records: constants must be a tuple of 8");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    /* The C reader's RingSteps are built from their C fields where the offset is an int64
     * (ring_step_record); any other step, or one that leaves its range, below. */
    int overflow = 0;
    long long off = PyLong_CheckExact(args[5])
                        ? PyLong_AsLongLongAndOverflow(args[5], &overflow) : 0;
    int c_fields = PyLong_CheckExact(args[5]) && !overflow && !PyErr_Occurred();
    PyErr_Clear();
    EntryCache cache;
    cache.n = 0;
    PyObject *steps = args[0], *root_ids = args[2], *trace_head = args[3], *is_sampled = args[4];
    PyObject *out = args[9];
    Py_ssize_t k = start < 0 ? 0 : start;
    for (; k < PyList_GET_SIZE(steps); k++) {
        if (used >= PyList_GET_SIZE(root_ids)) {
            break;
        }
        PyObject *step = PyList_GET_ITEM(steps, k);
        if (c_fields && Py_IS_TYPE(step, &otr_RingStep_Type)
            && ((RingStepCore *)step)->ev == NULL && ((RingStepCore *)step)->attrs == NULL) {
            int built = ring_step_record((RingStepCore *)step, args,
                                         PyList_GET_ITEM(root_ids, used), off, rss_every,
                                         &cache, out);
            if (built == 1) {
                used++;
                continue;
            }
            if (built < 0) {
                if (built == -2) {
                    otr_entry_cache_clear(&cache);
                    return NULL;
                }
                PyErr_Clear();  /* this step is the caller's, as at `stop` below */
                break;
            }
        }
        Py_INCREF(step);
        PyObject *f[5] = {NULL, NULL, NULL, NULL, NULL}, *trace = NULL, *flags = NULL,
                 *rec = NULL;
        int plain = 1;
        PyObject *rare[] = {rows_s_dev, rows_s_phase_attrs, rows_s_queued_waits,
                            rows_s_span_ids, rows_s_trace_id, rows_s_attrs};
        PyObject *error = PyObject_GetAttr(step, rows_s_error);
        if (error == NULL) {
            goto stop;
        }
        plain = error == Py_None;
        Py_DECREF(error);
        for (size_t i = 0; plain == 1 && i < sizeof(rare) / sizeof(rare[0]); i++) {
            plain = attr_empty(step, rare[i]);
        }
        if (plain <= 0) {
            goto stop;
        }
        PyObject *names[5] = {rows_s_ev, rows_s_step_loader, rows_s_index, rows_s_start_ns,
                              rows_s_end_ns};
        for (int i = 0; i < 5; i++) {
            if ((f[i] = PyObject_GetAttr(step, names[i])) == NULL) {
                goto stop;
            }
        }
        if (rss_every > 0) {  /* a step whose root reads the host's memory: Python's */
            int overflow;
            long long index = PyLong_AsLongLongAndOverflow(f[2], &overflow);
            if (!PyLong_CheckExact(f[2]) || overflow || (index == -1 && PyErr_Occurred())
                || index % rss_every == 0) {
                goto stop;
            }
        }
        trace = otr_ring_trace_id_index(trace_head, f[2]);
        if (trace == NULL) {
            goto stop;  /* an index that is no 64-bit int: Python's hash */
        }
        if (is_sampled == Py_None) {
            flags = otr_one;
            Py_INCREF(flags);
        }
        else {
            PyObject *sampled = PyObject_CallOneArg(is_sampled, trace);
            if (sampled == NULL) {
                goto stop;
            }
            int yes = PyObject_IsTrue(sampled);
            Py_DECREF(sampled);
            if (yes < 0) {
                goto stop;
            }
            flags = yes ? otr_one : otr_zero;
            Py_INCREF(flags);
        }
        PyObject *rec_args[12] = {f[0], f[1], f[2], f[3], f[4], trace, flags,
                                  PyList_GET_ITEM(root_ids, used), args[5], args[6], args[7],
                                  args[8]};
        rec = otr_flat_step_record_impl(rec_args, &cache);
        if (rec == NULL) {
            goto stop;
        }
        if (rec == Py_None) {
            goto stop;  /* not flat: the Python decoder */
        }
        if (PyList_Append(out, rec) < 0) {
            goto fail;
        }
        used++;
        Py_DECREF(rec);
        Py_DECREF(trace);
        Py_DECREF(flags);
        for (int i = 0; i < 5; i++) {
            Py_DECREF(f[i]);
        }
        Py_DECREF(step);
        continue;
    stop:  /* this step is the caller's (a problem reading it is raised there, for it) */
        PyErr_Clear();
        Py_XDECREF(rec);
        Py_XDECREF(trace);
        Py_XDECREF(flags);
        for (int i = 0; i < 5; i++) {
            Py_XDECREF(f[i]);
        }
        Py_DECREF(step);
        break;
    fail:
        Py_XDECREF(rec);
        Py_XDECREF(trace);
        Py_XDECREF(flags);
        for (int i = 0; i < 5; i++) {
            Py_XDECREF(f[i]);
        }
        Py_DECREF(step);
        otr_entry_cache_clear(&cache);
        return NULL;
    }
    otr_entry_cache_clear(&cache);
    return PyLong_FromSsize_t(k);
}

/* ---- ring_span_counts: what the training process's own cost reads of built records ---- */

/* A record's field `i` as an int64 (0: it is no int within int64). */
static int
rec_ll(PyObject *rec, Py_ssize_t i, long long *value)
{
    PyObject *v = PyTuple_GET_ITEM(rec, i);
    int overflow = 0;
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    *value = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow;
}

/* ring_span_counts(recs, offset_ns, cold_ns_per_span, last_end_ns)
 *     -> (warm_spans, cold_spans, last_end_ns) | None
 *
 * ring_build.span_counts in C (its twin): each step record's spans (root + phases) counted
 * warm or cold as self_cost.is_cold_step says of its wall time (`spans > 0 and wall >=
 * spans * cold_ns_per_span`), and the latest end (less the builder's offset) from
 * last_end_ns on. None where a record holds what this does not read exactly (a field that
 * is no int64, a phase field that is no list or None): the twin counts them. */
PyObject *
otr_ring_span_counts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "ring_span_counts(recs: list, offset_ns, cold_ns_per_span, last_end_ns)");
        return NULL;
    }
    long long off = 0, per_span = 0, last = 0;
    int overflow = 0;
    if (!PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
        || !PyLong_CheckExact(args[3])) {
        Py_RETURN_NONE;
    }
    off = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (!overflow) {
        per_span = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    }
    if (!overflow) {
        last = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    long long warm = 0, cold = 0;
    PyObject *recs = args[0];
    for (Py_ssize_t i = 0; !overflow && i < PyList_GET_SIZE(recs); i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i), *phases;
        long long start, end, wall, spans = 1, charge;
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) < 10
            || !rec_ll(rec, 4, &start) || !rec_ll(rec, 5, &end)) {
            Py_RETURN_NONE;
        }
        phases = PyTuple_GET_ITEM(rec, 9);
        if (PyList_CheckExact(phases)) {
            spans += PyList_GET_SIZE(phases);
        }
        else if (phases != Py_None) {
            Py_RETURN_NONE;
        }
        overflow = __builtin_sub_overflow(start, off, &start)
                   || __builtin_sub_overflow(end, off, &end)
                   || __builtin_sub_overflow(end, start, &wall)
                   || __builtin_mul_overflow(spans, per_span, &charge);
        if (!overflow) {
            if (wall >= charge) {  /* spans > 0 always: the root */
                cold += spans;
            }
            else {
                warm += spans;
            }
            if (end > last) {
                last = end;
            }
        }
    }
    if (overflow) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(LLL)", warm, cold, last);
}
