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

static void
entry_cache_clear(EntryCache *cache)
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
static int
entry_row_fields(EntryCache *cache, PyObject *entry, PyObject *data_name, PyObject **name,
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
static PyObject *
phase_row(PyObject **item, Py_ssize_t ordinal, PyObject *step_loader, PyObject *root_id,
          PyObject *offset, PyObject *data_name, EntryCache *cache)
{
    PyObject *name, *kind, *own_loader, *row = NULL;
    int own, data;
    if (entry_row_fields(cache, item[0], data_name, &name, &kind, &own_loader, &own,
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
        PyObject *row = phase_row(&PyTuple_GET_ITEM(ev, 4 * k), k + 1, args[1], args[2],
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
static PyObject *
flat_root_attributes(PyObject *const *args, PyObject *rows, PyObject *const *c)
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

static PyObject *flat_step_record_impl(PyObject *const *args, EntryCache *cache);

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
    return flat_step_record_impl(args, NULL);
}

static PyObject *
flat_step_record_impl(PyObject *const *args, EntryCache *cache)
{
    PyObject *const *c = &PyTuple_GET_ITEM(args[11], 0);
    PyObject *row_args[5] = {args[0], args[1], args[7], args[8], c[0]};
    PyObject *rows = flat_phase_rows_impl(row_args, cache);
    if (rows == NULL || rows == Py_None) {
        return rows;
    }
    PyObject *attrs = flat_root_attributes(args, rows, c);
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

/* ---- flat_step_records: a batch of ring steps' records, their trace ids included ------ */

static PyObject *rows_s_copy, *rows_s_update, *rows_s_digest;

/* The trace id of step `index` (an exact int within 64 bits), identity.step_trace_id's
 * blake2b(f"{run_id}\x00{step}", digest_size=16): `head`, hashlib's blake2b object fed the
 * run id's part, copied and fed the step's digits (hashlib's own C, without a Python frame
 * a step). NULL with no error set when `index` is no such int (the caller's Python
 * computes it). */
static PyObject *ring_trace_id_of(PyObject *head, long long value);

static PyObject *
ring_trace_id(PyObject *head, PyObject *index)
{
    if (!PyLong_CheckExact(index)) {
        return NULL;
    }
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return NULL;
    }
    return ring_trace_id_of(head, value);
}

/* int.from_bytes(d[:16], "big") or 1 (0 is the invalid trace id): one int made where
 * CPython's _PyLong_FromByteArray is there (3.8 to 3.13), else of its two halves. */
static PyObject *
trace_id_from_digest(const unsigned char *d)
{
    uint64_t hi = 0, lo = 0;
    for (int i = 0; i < 8; i++) {
        hi = (hi << 8) | d[i];
        lo = (lo << 8) | d[8 + i];
    }
    if (hi == 0 && lo == 0) {
        return PyLong_FromLong(1);
    }
#if PY_VERSION_HEX >= 0x03080000 && PY_VERSION_HEX < 0x030E0000
    return _PyLong_FromByteArray(d, 16, 0, 0);  /* big-endian, unsigned */
#else
    PyObject *high = PyLong_FromUnsignedLongLong(hi), *low = NULL, *shift = NULL,
             *shifted = NULL, *out = NULL;
    if (high != NULL && (low = PyLong_FromUnsignedLongLong(lo)) != NULL
        && (shift = PyLong_FromLong(64)) != NULL
        && (shifted = PyNumber_Lshift(high, shift)) != NULL) {
        out = PyNumber_Or(shifted, low);
    }
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(shift);
    Py_XDECREF(shifted);
    return out;
#endif
}

/* The decimal digits of `value` (as "%lld" writes them) at the end of `buf` (24 bytes):
 * their start. */
static char *
decimal_digits(long long value, char *buf)
{
    char *p = buf + 24;
    unsigned long long u = value < 0 ? 0ULL - (unsigned long long)value
                                     : (unsigned long long)value;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0) {
        *--p = '-';
    }
    return p;
}

/* The hash type's copy, update and digest, looked up on the type once (not on each object
 * a step: three method lookups a trace id), for the type of the last head seen; and the
 * bytearray the step's digits are written into for update (one, not a bytes a step: update
 * reads it at once, under the GIL). */
static PyObject *hash_type, *hash_copy, *hash_update, *hash_digest, *hash_digits;

static int
hash_methods(PyObject *head)
{
    PyObject *type = (PyObject *)Py_TYPE(head);
    if (type == hash_type) {
        return 0;
    }
    if (rows_s_digest == NULL
        && ((rows_s_copy = PyUnicode_InternFromString("copy")) == NULL
            || (rows_s_update = PyUnicode_InternFromString("update")) == NULL
            || (rows_s_digest = PyUnicode_InternFromString("digest")) == NULL)) {
        return -1;
    }
    if (hash_digits == NULL && (hash_digits = PyByteArray_FromStringAndSize(NULL, 24)) == NULL) {
        return -1;
    }
    PyObject *c = PyObject_GetAttr(type, rows_s_copy);
    PyObject *u = c ? PyObject_GetAttr(type, rows_s_update) : NULL;
    PyObject *d = u ? PyObject_GetAttr(type, rows_s_digest) : NULL;
    if (d == NULL) {
        Py_XDECREF(c);
        Py_XDECREF(u);
        return -1;
    }
    Py_INCREF(type);
    Py_XSETREF(hash_type, type);
    Py_XSETREF(hash_copy, c);
    Py_XSETREF(hash_update, u);
    Py_XSETREF(hash_digest, d);
    return 0;
}

/* ring_trace_id of step `value` (NULL: an error is set): type(head).copy(head), its
 * update(digits) and digest(), called as the type's functions with the object first (a
 * copy of another type: its own methods). */
static PyObject *
ring_trace_id_of(PyObject *head, long long value)
{
    if (hash_methods(head) < 0) {
        return NULL;
    }
    char text[24];
    char *digits = decimal_digits(value, text);
    PyObject *hash = PyObject_Vectorcall(hash_copy, &head, 1, NULL), *tail = NULL, *r = NULL,
             *digest = NULL, *out = NULL;
    Py_ssize_t n = text + 24 - digits;
    if (hash != NULL && PyByteArray_Resize(hash_digits, n) == 0) {
        memcpy(PyByteArray_AS_STRING(hash_digits), digits, (size_t)n);
        tail = hash_digits;
        Py_INCREF(tail);
        if ((PyObject *)Py_TYPE(hash) == hash_type) {
            PyObject *args[2] = {hash, tail};
            if ((r = PyObject_Vectorcall(hash_update, args, 2, NULL)) != NULL) {
                digest = PyObject_Vectorcall(hash_digest, args, 1, NULL);
            }
        }
        else if ((r = PyObject_CallMethodOneArg(hash, rows_s_update, tail)) != NULL) {
            digest = PyObject_CallMethodNoArgs(hash, rows_s_digest);
        }
    }
    if (digest != NULL) {
        if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != 16) {
            PyErr_SetString(PyExc_ValueError, "ring_trace_id: a 16-byte blake2b is needed");
        }
        else {
            out = trace_id_from_digest((const unsigned char *)PyBytes_AS_STRING(digest));
        }
    }
    Py_XDECREF(hash);
    Py_XDECREF(tail);
    Py_XDECREF(r);
    Py_XDECREF(digest);
    return out;
}

/* ring_trace_id(head, index) -> int | None: head (hashlib.blake2b of the run id's part,
 * digest_size=16) fed str(index), as step_trace_id reads it; None for an index that is no
 * int within 64 bits. */
PyObject *
otr_ring_trace_id(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ring_trace_id(head, index)");
        return NULL;
    }
    PyObject *out = ring_trace_id(args[0], args[1]);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

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

/* A phase row of a RingStep (span_rows.py's layout, as phase_row makes it of the event
 * list), from C numbers; NULL on error. `named`: its name is data_name. `same_start`: an
 * int equal to `start` to share (the step's start: its data phase opens with it), or NULL. */
static PyObject *
ring_phase_row(RingStepPhase *ph, Py_ssize_t ordinal, long long duration, long long start,
               long long end, PyObject *step_loader, PyObject *root_id, PyObject *data_name,
               EntryCache *cache, int *named, PyObject *same_start)
{
    PyObject *name, *kind, *own_loader;
    int own, data;
    if (entry_row_fields(cache, ph->phase, data_name, &name, &kind, &own_loader, &own, &data,
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

/* `input` of the host clock's bound (flat_root_attributes' `data_ns >= share * wall_ns > 0`)
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

/* The root attributes of a RingStep's record (flat_root_attributes' order and values);
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
    if (index == NULL || (trace = ring_trace_id_of(a[3], s->index)) == NULL) {
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
                    entry_cache_clear(&cache);
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
        trace = ring_trace_id(trace_head, f[2]);
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
        rec = flat_step_record_impl(rec_args, &cache);
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
        entry_cache_clear(&cache);
        return NULL;
    }
    entry_cache_clear(&cache);
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
