/* step_fields: a step record's OTLP Span messages in C (twin: encoding._Encoder.record).
 *
 * The exporter process encodes every step record it receives to its spans' protobuf bytes
 * (ScopeSpans.spans fields) as the record arrives. In Python that is a tuple unpack, a few
 * cache lookups and a join per span; here it is one call per step that writes each span's
 * fields into one buffer and makes one bytes object per span. The output is byte for byte
 * the Python encoder's (tests/export/otlp/test_encode_c.py).
 *
 * Only the usual step is encoded here: phases with a start, an end and a parent, no
 * status, events or device time, whose own attributes are none or only their device timing
 * (booleans and strings); a root with its usual attributes (step, loader, slow flag) and
 * what the step added after them, as exact strings, booleans, 64-bit integers or floats;
 * no run constant named like any of them. Anything else returns None before a byte is
 * made, and the Python encoder encodes the record: the choice is per record, and the C
 * encoder never raises for a record's values (a conversion error is cleared and is a
 * None).
 *
 * Usage (encoding.py)::
 *
 *     configure(step, phase, kind, loader, slow, timing_keys, kind_internal, unset_local)
 *     fields = step_fields(rec, span_ids, constants_block, constant_keys)  # list or None
 *     body = request_body(resource, scope, fields, scope_tail, resource_tail)  # or None
 *     n = run_draws(recs, k)  # int or None
 */
#include "_encode_c.h"

/* An empty buffer on its local storage. */
static void
buf_init(Buf *b)
{
    b->p = b->local;
    b->len = 0;
    b->cap = sizeof(b->local);
}

static PyObject *
step_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_Check(args[2]) || !PyAnySet_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "step_fields(rec, span_ids, constants_block: bytes, constant_keys: set)");
        return NULL;
    }
    if (k_step == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "step_fields: configure() was not called");
        return NULL;
    }
    PyObject *rec = args[0], *span_ids = args[1];
    if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != C_LEN
        || !PyList_CheckExact(span_ids)) {
        Py_RETURN_NONE;
    }
    Step st = enc_run_step(args[2], args[3]);
    Buf b;
    buf_init(&b);
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    int done = enc_record(&b, rec, ((PyListObject *)span_ids)->ob_item, PyList_GET_SIZE(span_ids),
                      out, &st);
    if (b.p != b.local) {
        PyMem_Free(b.p);
    }
    if (done == DONE) {
        return out;
    }
    Py_DECREF(out);
    if (done == FAILED) {
        return NULL;
    }
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* steps_fields(recs, start, ids, at, constants_block, constant_keys, out) -> (k, at):
 * from recs[start] on, each record's spans as step_fields writes them, appended to `out`,
 * its phases' span ids taken from ids[at:] in turn; stops at the first record it does not
 * encode (k, with `at` where its ids begin): one with no phases or ids of its own (it draws
 * none from `ids`), one whose ids `ids` runs out of, one this encoder leaves to Python, or
 * one that fails here (the Python encodes it, and reports its own error). One call a frame
 * of the usual steps (span_fields.encode_frame), not one a record. */
static PyObject *
steps_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyList_Check(args[0]) || !PyList_Check(args[2])
        || !PyBytes_Check(args[4]) || !PyAnySet_Check(args[5]) || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "steps_fields(recs: list, start, ids: list, at, constants_block: bytes, "
                        "constant_keys: set, out: list)");
        return NULL;
    }
    if (k_step == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "steps_fields: configure() was not called");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[1]), at = PyLong_AsSsize_t(args[3]);
    if ((k == -1 || at == -1) && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *recs = args[0], *ids = args[2], *out = args[6];
    Step st = enc_run_step(args[4], args[5]);
    Buf b;
    buf_init(&b);
    int failed = 0;
    for (; k >= 0 && k < PyList_GET_SIZE(recs); k++) {
        PyObject *rec = PyList_GET_ITEM(recs, k);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != C_LEN) {
            break;
        }
        PyObject *phases = PyTuple_GET_ITEM(rec, C_PHASES), *own = PyTuple_GET_ITEM(rec, C_IDS);
        if ((!PyList_CheckExact(phases) && !PyTuple_CheckExact(phases)) || own != Py_None) {
            break;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(phases);
        if (n == 0 || at + n > PyList_GET_SIZE(ids)) {
            break;
        }
        Py_ssize_t before = PyList_GET_SIZE(out);
        /* The ids in place: `ids` is the caller's pool, which nothing enc_record() calls can
         * reach to change; the record is held meanwhile. */
        Py_INCREF(rec);
        int done = enc_record(&b, rec, ((PyListObject *)ids)->ob_item + at, n, out, &st);
        Py_DECREF(rec);
        if (done != DONE) {  /* its spans so far out again: the record is Python's */
            PyErr_Clear();
            if (PyList_SetSlice(out, before, PyList_GET_SIZE(out), NULL) < 0) {
                failed = 1;
            }
            break;
        }
        at += n;
    }
    if (b.p != b.local) {
        PyMem_Free(b.p);
    }
    if (failed) {
        return NULL;
    }
    return Py_BuildValue("(nn)", k, at);
}

/* run_draws(recs, k) -> int | None: the phase span ids the run of records from recs[k]
 * draws, up to the first record that draws none or its own (no phases, or ids handed to
 * user spans): span_fields._run_draws, the twin. None for a record of another shape on the
 * way (not a record tuple, phases not a list or tuple, ids neither None nor a dict): the
 * Python counts then. */
static PyObject *
run_draws(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "run_draws(recs: list, k: int)");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *recs = args[0];
    Py_ssize_t total = 0;
    for (k = k < 0 ? 0 : k; k < PyList_GET_SIZE(recs); k++) {
        PyObject *rec = PyList_GET_ITEM(recs, k);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != C_LEN) {
            Py_RETURN_NONE;
        }
        PyObject *phases = PyTuple_GET_ITEM(rec, C_PHASES), *ids = PyTuple_GET_ITEM(rec, C_IDS);
        if (phases == Py_None) {  /* an operation between steps: draws none */
            break;
        }
        if ((!PyList_CheckExact(phases) && !PyTuple_CheckExact(phases))
            || (ids != Py_None && !PyDict_CheckExact(ids))) {
            Py_RETURN_NONE;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(phases);
        if (n == 0 || (ids != Py_None && PyDict_GET_SIZE(ids) > 0)) {
            break;
        }
        total += n;
    }
    return PyLong_FromSsize_t(total);
}

/* request_body(resource, scope, fields, scope_tail, resource_tail) -> bytes | None:
 * the ExportTraceServiceRequest of one ResourceSpans (tag 1) with one ScopeSpans (tag 2):
 * the Resource field, then the ScopeSpans' scope field, its spans' fields and its tail (its
 * schema_url field, or empty), then the resource's tail; None when a field is not exactly
 * bytes (a user span of its own scope: encoding._Encoder.request groups those). The
 * Python twin is _Encoder._resource_spans: the same bytes, here summed and copied in one
 * pass into one bytes object. */
static PyObject *
request_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])
        || !PyList_Check(args[2]) || !PyBytes_Check(args[3]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "request_body(resource: bytes, scope: bytes, fields: list, "
                        "scope_tail: bytes, resource_tail: bytes)");
        return NULL;
    }
    PyObject *fields = args[2];
    Py_ssize_t n = PyList_GET_SIZE(fields);
    uint64_t spans = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(fields, i);
        if (!PyBytes_CheckExact(f)) {
            Py_RETURN_NONE;
        }
        spans += (uint64_t)PyBytes_GET_SIZE(f);
    }
    uint64_t res = (uint64_t)PyBytes_GET_SIZE(args[0]), sc = (uint64_t)PyBytes_GET_SIZE(args[1]);
    uint64_t sc_tail = (uint64_t)PyBytes_GET_SIZE(args[3]);
    uint64_t res_tail = (uint64_t)PyBytes_GET_SIZE(args[4]);
    uint64_t scope_len = sc + spans + sc_tail;  /* the ScopeSpans message */
    uint64_t rs_len = res + 1 + varint_len(scope_len) + scope_len + res_tail;
    uint64_t total = 1 + varint_len(rs_len) + rs_len;
    if (total > (uint64_t)PY_SSIZE_T_MAX) {
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) {
        return NULL;
    }
    char *o = PyBytes_AS_STRING(out);
    *o++ = 0x0a;
    o += varint_to(o, rs_len);
    memcpy(o, PyBytes_AS_STRING(args[0]), res);
    o += res;
    *o++ = 0x12;
    o += varint_to(o, scope_len);
    memcpy(o, PyBytes_AS_STRING(args[1]), sc);
    o += sc;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(fields, i);
        Py_ssize_t len = PyBytes_GET_SIZE(f);
        memcpy(o, PyBytes_AS_STRING(f), (size_t)len);
        o += len;
    }
    memcpy(o, PyBytes_AS_STRING(args[3]), sc_tail);
    o += sc_tail;
    memcpy(o, PyBytes_AS_STRING(args[4]), res_tail);
    return out;
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *step, *phase, *kind, *loader, *slow, *timing, *kind_bytes, *unset;
    if (!PyArg_ParseTuple(args, "UUUUUO!SS:configure", &step, &phase, &kind, &loader, &slow,
                          &PyTuple_Type, &timing, &kind_bytes, &unset)) {
        return NULL;
    }
    PyObject **slots[] = {&k_step, &k_phase, &k_kind, &k_loader, &k_slow, &k_timing,
                          &kind_internal, &unset_local};
    PyObject *values[] = {step, phase, kind, loader, slow, timing, kind_bytes, unset};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"step_fields", (PyCFunction)(void (*)(void))step_fields, METH_FASTCALL,
     "step_fields(rec, span_ids, constants_block, constant_keys) -> list[bytes] | None\n\n"
     "A step record's spans as ScopeSpans.spans fields, the bytes _Encoder.record makes;\n"
     "None for a record this encoder leaves to Python."},
    {"steps_fields", (PyCFunction)(void (*)(void))steps_fields, METH_FASTCALL,
     "steps_fields(recs, start, ids, at, constants_block, constant_keys, out) -> (k, at)\n\n"
     "Records' spans from recs[start] on, appended to out, their phase ids from ids[at:],\n"
     "up to the first record left to Python (its index, and where its ids begin)."},
    {"run_draws", (PyCFunction)(void (*)(void))run_draws, METH_FASTCALL,
     "run_draws(recs, k) -> int | None\n\n"
     "The phase span ids the run of records from recs[k] draws (None: the Python counts)."},
    {"request_body", (PyCFunction)(void (*)(void))request_body, METH_FASTCALL,
     "request_body(resource, scope, fields, scope_tail, resource_tail) -> bytes | None\n\n"
     "One ResourceSpans' request of spans of one scope, the bytes\n"
     "_Encoder._resource_spans joins; None when a field is not exactly bytes."},
    {"configure", configure, METH_VARARGS,
     "configure(step, phase, kind, loader, slow, timing_keys, kind_internal, unset_local)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode_c",
                                    "OTLP Span messages of a step record, in C.", -1, methods};

PyMODINIT_FUNC
PyInit__encode_c(void)
{
    if (sixty_four == NULL && (sixty_four = PyLong_FromLong(64)) == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
