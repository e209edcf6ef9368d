/* otel_train.recording._recorder_c: the recorder's hot path in C, an optional accelerator.
 *
 * Three types, each the twin of pure Python in pure_twin.py, which stays the reference and
 * runs wherever this module was not built (or OTEL_TRAIN_PURE_PYTHON=1 is set):
 *
 * - PhaseCore, the base of recorder.Phase (twin: PurePhaseCore). __enter__ appends
 *   (phase, start_ns) to the current step's event list, __exit__ appends (end_ns, exception
 *   or None), with no Python frame per phase boundary.
 * - StepCore, the base of recorder.Step (twin: PureStepCore). The fields every step has live
 *   in C slots, and step.phase(name) / step.monitor(name) look the phase up in C, refusing
 *   once the step has ended (the twin shadows them with the tables' lookups instead).
 * - StepLoop, what Recorder.steps returns (twin: the generator step_loop). Each
 *   __next__ ends the previous step (unless the loop body ended it) and starts the next, the
 *   fetch timed as the data phase. Leaving the loop (break, an exception in its body) closes
 *   it: the step in progress ends and is held, as GeneratorExit does to the generator.
 *
 * Why C: with steps 1 ms apart (caches cold, as in a real loop), a 7-span step's context
 * managers cost 1.5-1.8x six empty Python `with` blocks in pure Python, and the Python
 * frames of __enter__/__exit__, the generator and the instance-dict stores of a new Step are
 * most of the difference (benchmarks/bench_hot_path.py). Everything else (the device modes,
 * the rare paths, the errors' messages) calls back into the Python objects, so both twins
 * share one behaviour; tests/recording/test_recorder_c.py runs the hot-path tests against both and
 * compares their records.
 *
 * Timestamps equal time.perf_counter_ns(): on Linux both read CLOCK_MONOTONIC; elsewhere
 * this module calls time.perf_counter_ns itself.
 *
 * Sources: this file (the interned names, RecorderCore, the module), _recorder_c_phase.c,
 * _recorder_c_step.c, _recorder_c_loop.c, _recorder_c_ring.c (the step ring's writer), _recorder_c_rows.c (off the hot path: a flat
 * step's phase rows for the span worker); _recorder_c.h shares the structs and helpers.
 */
#include "_recorder_c.h"

PyObject *s_error, *s_end_ns, *s_release_held, *s_device_step_start,
    *s_device_step_end, *s_drops, *s_add, *s_span_count, *s_finish_step, *s_queue_full,
    *s_outside_error, *s_ended_error, *s_append, *s_train_phases,
    *s_monitor_phases, *s_loop_mode, *s_on_batch, *s_before_fetch;
PyObject *otr_perf_counter_ns, *otr_one, *otr_zero;

/* ---- RecorderCore --------------------------------------------------------------------- */

/* The recorder's fields that every step and phase boundary reads or writes, in C slots (the
 * base of recorder.Recorder; twin: PureRecorderCore, plain attributes). The struct is in
 * _recorder_c.h: the phases and the step loop read its slots directly. */

static PyObject *
RecorderCore_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    RecorderCore *self = (RecorderCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    PyObject **none_slots[] = {&self->ev, &self->current, &self->held, &self->queue,
                                &self->ring};
    for (size_t i = 0; i < sizeof(none_slots) / sizeof(none_slots[0]); i++) {
        Py_INCREF(Py_None);
        *none_slots[i] = Py_None;
    }
    Py_INCREF(Py_False);
    self->closed = Py_False;
    PyObject **zero_slots[] = {&self->next_index, &self->last_step_end_ns, &self->max_queued};
    for (size_t i = 0; i < sizeof(zero_slots) / sizeof(zero_slots[0]); i++) {
        Py_INCREF(otr_zero);
        *zero_slots[i] = otr_zero;
    }
    return (PyObject *)self;
}

static int
RecorderCore_traverse(RecorderCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ev);
    Py_VISIT(self->current);
    Py_VISIT(self->ring);
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
    Py_CLEAR(self->ring);
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
    {"ring", T_OBJECT_EX, offsetof(RecorderCore, ring), 0,
     "the step ring's writer (a finished flat step goes there), or None"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject otr_RecorderCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._recorder_c.RecorderCore",
    .tp_doc = "The recorder's hot fields (the base of recorder.Recorder).",
    .tp_basicsize = sizeof(RecorderCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = RecorderCore_new,
    .tp_dealloc = (destructor)RecorderCore_dealloc,
    .tp_traverse = (traverseproc)RecorderCore_traverse,
    .tp_clear = (inquiry)RecorderCore_clear,
    .tp_members = RecorderCore_members,
};

/* ---- the module ----------------------------------------------------------------------- */

static PyMethodDef recorder_c_functions[] = {
    {"flat_phase_rows", (PyCFunction)(void (*)(void))otr_flat_phase_rows, METH_FASTCALL,
     "flat_phase_rows(ev, step_loader, root_id, offset_ns, data_name): a flat step's phase "
     "rows (twin: records.step_records._flat_phases), None for any other event list."},
    {"flat_step_record", (PyCFunction)(void (*)(void))otr_flat_step_record, METH_FASTCALL,
     "flat_step_record(ev, step_loader, index, start_ns, end_ns, trace_id, flags, root_id, "
     "offset_ns, last_bound, span_name, constants): a flat step's span record (twin: "
     "records.step_records.StepRecordBuilder._step_record), None for any other event list."},
    {"flat_step_records", (PyCFunction)(void (*)(void))otr_flat_step_records, METH_FASTCALL,
     "flat_step_records(steps, start, root_ids, trace_head, is_sampled, offset_ns, "
     "last_bound, span_name, constants, out, rss_every, ids_at) -> int: ring steps' records "
     "from steps[start] on, appended to out, up to the first it does not build (its index)"},
    {"ring_trace_id", (PyCFunction)(void (*)(void))otr_ring_trace_id, METH_FASTCALL,
     "ring_trace_id(head, index) -> int | None: a copy of head (hashlib.blake2b of the run "
     "id's part, digest_size=16) fed str(index), as an int: step_trace_id's"},
    {"ring_span_counts", (PyCFunction)(void (*)(void))otr_ring_span_counts, METH_FASTCALL,
     "ring_span_counts(recs, offset_ns, cold_ns_per_span, last_end_ns) -> (warm, cold, "
     "last_end_ns) | None: step records counted as the training process's own cost would "
     "(twin: export.process.ring_build.span_counts)"},
    {"ring_read_items", (PyCFunction)(void (*)(void))otr_ring_read_items, METH_FASTCALL,
     "ring_read_items(buffer, capacity, position, max_items, move_tail, strings, phases, "
     "phase_type, queued): ([(item, end, ordinal)], position) of the step ring's "
     "records from position (twin: step_ring_reader.StepRingReader._read_items_python)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef recorder_c_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "otel_train.recording._recorder_c",
    .m_doc = "The recorder's hot path in C (optional; pure_twin.py holds its pure-Python twin).",
    .m_size = -1,
    .m_methods = recorder_c_functions,
};

#define INTERN(var, text)                                 \
    do {                                                  \
        if ((var = PyUnicode_InternFromString(text)) == NULL) \
            return NULL;                                  \
    } while (0)

PyMODINIT_FUNC
PyInit__recorder_c(void)
{
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
    INTERN(s_loop_mode, "loop_mode");
    INTERN(s_on_batch, "on_batch");
    INTERN(s_before_fetch, "before_fetch");
    if ((otr_one = PyLong_FromLong(1)) == NULL || (otr_zero = PyLong_FromLong(0)) == NULL) {
        return NULL;
    }
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) {
        return NULL;
    }
    otr_perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (otr_perf_counter_ns == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&recorder_c_module);
    if (m == NULL) {
        return NULL;
    }
    struct { const char *name; PyTypeObject *type; } types[] = {
        {"RecorderCore", &otr_RecorderCore_Type}, {"PhaseCore", &otr_PhaseCore_Type},
        {"StepCore", &otr_StepCore_Type}, {"StepLoop", &otr_StepLoop_Type},
        {"RingWriterCore", &otr_RingWriterCore_Type}, {"RingStep", &otr_RingStep_Type},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
        Py_INCREF(types[i].type);
        if (PyModule_AddObject(m, types[i].name, (PyObject *)types[i].type) < 0) {
            Py_DECREF(types[i].type);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
