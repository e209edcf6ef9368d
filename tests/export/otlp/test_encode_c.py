"""The C span encoder (``_encode_c.c``) writes a step record's spans byte for byte as the
Python encoder (``encoding._Encoder.record``) does, encodes only the usual step itself and
hands every other record to the Python, per record."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from span_samples import _records
from train_helpers import clean_env  # noqa: F401

from otel_train.export.otlp import encoding
from otel_train.export.otlp.encoding import _Encoder
from otel_train.export.otlp.span_fields import encode_frame

needs_c = pytest.mark.skipif(not encoding.ACCELERATED,
                             reason="the C span encoder was not built here (CI requires it)")

STEP, PHASE, KIND, LOADER, SLOW = ("train.step", "train.phase", "train.phase.kind",
                                   "train.dataloader", "train.slow")
U64 = 2**64 - 1


def _flat(records):
    """A recorded flat step whose phases have no attributes of their own."""
    return next(r for r in records if r[9] and not any(p[10] for p in r[9]))


def _with(rec, **fields):
    names = ("name", "trace", "root", "flags", "start", "end", "attrs", "status", "events",
             "phases", "ids")
    out = list(rec)
    for key, value in fields.items():
        out[names.index(key)] = value
    return tuple(out)


def _phase(p, **fields):
    names = ("name", "kind", "loader", "duration", "ordinal", "parent", "start", "end",
             "status", "events", "extra", "device")
    out = list(p)
    for key, value in fields.items():
        out[names.index(key)] = value
    return tuple(out)


def _usual_shapes(step):
    """Steps the C encoder encodes itself: every value type it writes, unicode, long names
    (two- and three-byte lengths), extreme ids and times, nested and tied phases, no
    phases, device timing attributes, the root's own attributes."""
    i = step[6][STEP]
    ph = list(step[9])
    root = step[2]
    shapes = {
        "recorded": step,
        "no phases": _with(step, phases=[]),
        "tuple phases": _with(step, phases=tuple(ph)),
        "unicode": _with(step, name="schritt·ü", phases=[_phase(p, name="vorwärts→" + p[0],
                                                                  loader="daten✓")
                                                       for p in ph]),
        "long": _with(step, phases=[_phase(p, name="f" * 5000, loader="L" * 20000)
                                    for p in ph]),
        "extreme times and ids": _with(step, trace=2**128 - 1, root=U64, start=1, end=U64,
                                       phases=[_phase(p, start=1, end=U64 - k, parent=U64)
                                               for k, p in enumerate(ph)]),
        "small trace id": _with(step, trace=1),
        "nested": _with(step, phases=[_phase(ph[0], end=ph[-1][7] + 5)] + [
            _phase(p, parent=1) for p in ph[1:]]),
        "tied ends": _with(step, phases=[_phase(p, end=ph[0][7]) for p in ph]),
        "device timing": _with(step, phases=[_phase(p, extra={"train.device.synced": True,
                                                               "train.device.timing": "event"})
                                             for p in ph]),
        "one timing": _with(step, phases=[_phase(p, extra={"train.device.timing": "sync"})
                                          for p in ph]),
        "empty extra": _with(step, phases=[_phase(p, extra={}) for p in ph]),
        "asked ids": _with(step, ids={0: 0xABCDEF, 2: U64}),
        "int step": _with(step, attrs={STEP: -5, SLOW: False}),
        "big step": _with(step, attrs={STEP: 2**63 + 7, SLOW: True}),
        "min step": _with(step, attrs={STEP: -2**63, SLOW: True}),
        "str step": _with(step, attrs={STEP: "s" * 200, SLOW: True}),
        "root loader": _with(step, attrs={STEP: i, LOADER: "train", SLOW: True}),
        "loader after slow": _with(step, attrs={STEP: i, SLOW: True, LOADER: "train"}),
        "root's own values": _with(step, attrs={
            STEP: i, LOADER: "val", SLOW: False, "train.step.bound": "compute",
            "train.tokens": 256, "train.neg": -1, "train.mfu": 0.41, "z": -0.0,
            "nan": math.nan, "inf": -math.inf, "flag": True, "big": U64, "": "",
            "unicode ✓": "wert ✓" * 50}),
        "int kind": _with(step, phases=[_phase(p, kind=3) for p in ph]),
    }
    assert shapes["recorded"][2] == root
    return shapes


class _Str(str):
    """A str subclass: the Python writes it through its own ``encode``."""

    def encode(self, *args, **kwargs):  # type: ignore[override]
        return super().encode(*args, **kwargs) + b"!"


def _odd_shapes(step):
    """Steps the C encoder leaves to Python (and what makes each odd)."""
    ph = list(step[9])
    i = step[6][STEP]
    return {
        "between steps": _with(step, phases=None),
        "phase status": _with(step, phases=[_phase(ph[0], status=(2, "boom"))] + ph[1:]),
        "phase event": _with(step, phases=[_phase(ph[0], events=(("e", 5, {"k": 1}),))]
                             + ph[1:]),
        "device time": _with(step, phases=[_phase(p, device=0.0125) for p in ph]),
        "phase attribute": _with(step, phases=[_phase(ph[0], extra={"lr": 0.1})] + ph[1:]),
        "int timing value": _with(step, phases=[_phase(ph[0], extra={
            "train.device.synced": 1})] + ph[1:]),
        "zero start": _with(step, phases=[_phase(ph[0], start=0)] + ph[1:]),
        "zero root end": _with(step, end=0),
        "root status": _with(step, status=(2, "failed")),
        "root event": _with(step, events=(("oom", 7, {}),)),
        "slow not a bool": _with(step, attrs={STEP: i, SLOW: 1}),
        "no slow flag": _with(step, attrs={STEP: i}),
        "slow first": _with(step, attrs={SLOW: True, STEP: i}),
        "list value": _with(step, attrs={STEP: i, SLOW: True, "shape": [1, 2]}),
        "over 64 bits": _with(step, attrs={STEP: i, SLOW: True, "n": 2**64}),
        "empty phase name": _with(step, phases=[_phase(ph[0], name="")] + ph[1:]),
        "empty root name": _with(step, name=""),
        "str subclass": _with(step, attrs={STEP: i, SLOW: True, "k": _Str("v")}),
    }


def _both(rec, constants, seed):
    """(the Python encoder's fields, the C encoder's fields, True if C encoded it)."""
    random.seed(seed)
    want = _Encoder(accelerated=False).record(rec, constants)
    enc = _Encoder(accelerated=True)
    random.seed(seed)
    got = enc.record(rec, constants)
    return want, got, enc.records_in_c == 1


def _assert_left_to_python(rec, constants, seed):
    """Neither encoder encodes ``rec`` in C, and both end alike (fields or the exception)."""
    outcomes = []
    for accelerated in (False, True):
        enc = _Encoder(accelerated=accelerated)
        random.seed(seed)
        try:
            outcomes.append(enc.record(rec, constants))
        except Exception as exc:
            outcomes.append(type(exc))
        assert enc.records_in_c == 0
    assert outcomes[0] == outcomes[1], (rec, outcomes)


@needs_c
def test_the_c_encoder_writes_the_python_encoders_bytes_for_every_step_it_encodes(tmp_path):
    records, _, factory = _records(tmp_path)
    step = _flat(records)
    constants = factory.run_constants
    in_c = []
    for n, rec in enumerate(records):  # every recorded shape, each in C or in Python
        want, got, c = _both(rec, constants, n)
        assert got == want, n
        in_c.append(c)
    assert any(in_c) and not all(in_c)  # the recorded monitor operation goes to Python
    # A CPU run's constants name its timing (train.device.synced, train.device.timing); a
    # phase's own timing attributes then follow the rows' rules, in Python.
    timing = ("train.device.synced", "train.device.timing")
    assert all(key in constants for key in timing)
    per_phase = {k: v for k, v in constants.items() if k not in timing}
    for name, rec in _usual_shapes(step).items():
        for consts in (constants, per_phase):
            want, got, c = _both(rec, consts, 7)
            assert c == (consts is per_phase or "timing" not in name), name
            assert got == want, name
    # Odd run constants: values of every type, a unicode one, a long one.
    odd_constants = dict(constants, **{"c.bool": False, "c.float": 1.5, "c.neg": -3,
                                       "c.ü": "ü" * 3000})
    want, got, c = _both(step, odd_constants, 8)
    assert c and got == want


@needs_c
def test_every_other_record_is_encoded_by_the_python_as_it_was(tmp_path):
    records, _, factory = _records(tmp_path)
    step = _flat(records)
    for name, rec in _odd_shapes(step).items():
        want, got, c = _both(rec, factory.run_constants, 9)
        assert not c, name
        assert got == want, name
    # Run constants named like a step's attributes: the rows' rules, in Python.
    for key in (SLOW, "train.tokens", "train.mfu"):
        rec = _usual_shapes(step)["root's own values"]
        named = dict(factory.run_constants, **{key: "constant"})
        want, got, c = _both(rec, named, 10)
        assert not c, key
        assert got == want, key


@needs_c
def test_values_the_c_encoder_cannot_write_come_out_of_the_python_alike():
    rec = ("train.step", 1, 2, 1, 10, 20, {STEP: 1, SLOW: False}, None, (),
           [("forward", "compute", None, 5, 1, 2, 11, 19, None, (), None, None)], None)
    odd = [_with(rec, phases=[_phase(rec[9][0], name="bad \ud800")]),
           _with(rec, attrs={STEP: 1, SLOW: False, "s": "bad \ud800"}),
           _with(rec, trace=-1), _with(rec, trace=2**130), _with(rec, root=2**64),
           _with(rec, phases=[_phase(rec[9][0], end=-1)]),
           _with(rec, phases=[_phase(rec[9][0], parent=0)]),
           _with(rec, phases=[_phase(rec[9][0], parent=7)]),
           _with(rec, phases=[rec[9][0][:11]]), _with(rec, ids={0: 2**64})]
    for r in odd:
        _assert_left_to_python(r, {"run": "x"}, 12)


@needs_c
def test_the_c_encoders_spans_decode_with_the_official_protobuf_classes(tmp_path):
    records, _, factory = _records(tmp_path)
    step = _flat(records)
    rec = _usual_shapes(step)["root's own values"]
    enc = _Encoder(accelerated=True)
    random.seed(11)
    fields = enc.record(rec, factory.run_constants)
    assert enc.records_in_c == 1 and enc.records_in_python == 0
    req = ExportTraceServiceRequest.FromString(enc.request(fields, factory.resource,
                                                           factory.scope))
    (rs,) = req.resource_spans
    (ss,) = rs.scope_spans
    assert ss.scope.name == factory.scope.name
    spans = list(ss.spans)
    assert len(spans) == len(rec[9]) + 1
    root = spans[-1]
    assert root.name == rec[0] and root.trace_id == rec[1].to_bytes(16, "big")
    assert root.span_id == rec[2].to_bytes(8, "big") and root.parent_span_id == b""
    assert (root.start_time_unix_nano, root.end_time_unix_nano) == (rec[4], rec[5])
    assert root.kind == 1 and root.status.code == 0 and root.flags == 0x100

    def value(v):
        kind = v.WhichOneof("value")
        return getattr(v, kind)

    attrs = {kv.key: value(kv.value) for kv in root.attributes}
    for key, want in dict(factory.run_constants, **rec[6]).items():
        got = attrs[key]
        if type(want) is int and want >= 2**63:  # int_value is an int64, as the SDK writes it
            want -= 2**64
        assert got == want or (math.isnan(want) and math.isnan(got)), key
    assert math.copysign(1.0, attrs["z"]) == -1.0
    for span, phase in zip(spans, rec[9]):
        assert span.name == phase[0] and span.parent_span_id == rec[2].to_bytes(8, "big")
        assert (span.start_time_unix_nano, span.end_time_unix_nano) == phase[6:8]
        a = {kv.key: value(kv.value) for kv in span.attributes}
        assert a[STEP] == rec[6][STEP] and a[PHASE] == phase[0] and a[KIND] == phase[1]
        assert a.get(LOADER) == phase[2]
    assert len({s.span_id for s in spans}) == len(spans)


@pytest.mark.parametrize("pure", [True, False])
def test_otel_train_pure_python_selects_the_python_encoder(pure):
    env = {k: v for k, v in os.environ.items() if k != "OTEL_TRAIN_PURE_PYTHON"}
    if pure:
        env["OTEL_TRAIN_PURE_PYTHON"] = "1"
    code = ("from otel_train.export.otlp import encoding as e\n"
            "print(e.ACCELERATED, e.ENCODER)\n"
            "rec = ('train.step', 1, 2, 1, 10, 20, {'train.step': 1, 'train.slow': False}, "
            "None, (), [], None)\n"
            "enc = e._Encoder(); enc.record(rec, {'run': 'x'})\n"
            "print(enc.records_in_c, enc.records_in_python)\n"
            "try:\n    e._Encoder(accelerated=True)\nexcept ValueError as exc:\n"
            "    print('refused', 'accelerated' in str(exc))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    if pure:
        assert out == ["False pure Python (OTEL_TRAIN_PURE_PYTHON is set)", "0 1",
                       "refused True"]
    elif encoding.ACCELERATED:
        assert out == ["True C (otel_train.export.otlp._encode_c)", "1 0"]


def test_ci_builds_and_uses_the_c_span_encoder():
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("only CI must have built it; elsewhere the Python encoder is allowed")
    assert encoding.ACCELERATED, "pip install -e . did not build otel_train/export/otlp/_encode_c.c"
    assert _Encoder()._step_fields is not None


def test_the_python_encoder_alone_passes_the_encoding_tests():
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "OTEL_TRAIN_PURE_PYTHON"}
    env["OTEL_TRAIN_PURE_PYTHON"] = "1"
    tests = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "export/otlp/test_encoding.py", "export/test_stage.py"],
        cwd=tests, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


@needs_c
def test_ids_and_times_at_the_edges_of_64_bits_are_written_by_the_c_encoder_as_by_the_python():
    """Ints read digit by digit below 2**63 and by their bit count above: every id and time
    up to 2**64 - 1 is written in C, the same bytes; 2**64 and negatives go to Python."""
    rec = ("train.step", 2**127 + 5, 2**63, 1, 10, 2**64 - 1, {STEP: 1, SLOW: False}, None,
           (), [("forward", "compute", None, 5, 1, 2**63, 2**62, 2**63 - 1, None, (), None,
                 None)], {0: 2**64 - 1})
    for root, start, end, phase_end in ((2**63, 10, 2**64 - 1, 2**63 - 1),
                                        (2**64 - 1, 2**63, 2**63 + 1, 2**64 - 1),
                                        (1, 1, 2**62, 2**63)):
        r = _with(_with(rec, root=root, end=end), start=start,
                  phases=[_phase(rec[9][0], end=phase_end, parent=root)])
        want, got, c = _both(r, {"run": "x"}, 3)
        assert c and got == want, (root, start, end, phase_end)
    for odd in (_with(rec, end=2**64), _with(rec, start=-5), _with(rec, ids={0: -1})):
        _assert_left_to_python(odd, {"run": "x"}, 3)


@needs_c
def test_a_frame_of_records_encoded_in_c_is_the_python_encoders_bytes(tmp_path):
    """encode_frame with the C (steps_fields: runs of the usual step in one call, a
    record it leaves, half encoded, given back to the Python) against the Python encoder
    alone: the same fields, the same ids drawn, the same record handed over as failed."""
    records, _, factory = _records(tmp_path)
    step = _flat(records)
    shapes = list(_usual_shapes(step).values())
    odd = list(_odd_shapes(step).values())
    broken = _with(step, phases=[("forward",)])
    frame = []
    for i in range(40):  # usual runs broken by odd records, now and then
        frame.append(shapes[i % len(shapes)])
        if i % 7 == 3:
            frame.append(odd[i % len(odd)])
    frame += records + [broken] + shapes
    outcomes = []
    for accelerated in (False, True):
        enc = _Encoder(accelerated=accelerated)
        random.seed(21)
        failed = []
        fields = encode_frame(enc, frame, factory.run_constants,
                              lambda r, e: failed.append(r))
        outcomes.append((fields, failed, random.getrandbits(64)))
        if accelerated:
            assert enc.records_in_c >= 40
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] == [broken]


@needs_c
def test_a_request_joined_in_c_is_the_python_joins_bytes(tmp_path):
    """_Encoder.request with the C join (request_body) against the Python join alone: with
    and without schema URLs (a long one: two-byte lengths), no spans, a request over 2 MiB
    (four-byte lengths), and user spans of their own scope among them (left to the Python,
    which groups them by scope)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_train.records.span_rows import RowSpanFactory

    records, user_rows, factory = _records(tmp_path)
    own = [s for rec in records for s in _Encoder(accelerated=False).record(
        rec, factory.run_constants)]
    assert own and all(type(s) is bytes for s in own)
    user = [_Encoder().row_field(row, factory.run_constants) for row in user_rows]
    assert any(type(s) is not bytes for s in user)  # a user span of its own scope
    batches = [own, [], own * 2000, own[:1], own + user]
    for r_schema, s_schema in (("", ""), ("https://r/1", "https://s/" + "x" * 300)):
        schemed = RowSpanFactory(Resource(dict(factory.resource.attributes), r_schema),
                                 InstrumentationScope("otel_train", "1.0", s_schema),
                                 factory.run_constants)
        for batch in batches:
            bodies = [_Encoder(accelerated=a).request(batch, schemed.resource, schemed.scope)
                      for a in (False, True)]
            assert bodies[0] == bodies[1]
            assert len(ExportTraceServiceRequest.FromString(bodies[1]).resource_spans) == 1
    joined = encoding._encode_c.request_body
    assert joined(b"", b"", [b"x", bytearray(b"y")], b"", b"") is None  # not bytes: Python's
    with pytest.raises(TypeError):
        joined(b"", b"", (b"x",), b"", b"")


@needs_c
def test_a_long_run_of_steps_draws_its_ids_in_chunks_as_a_draw_a_record(tmp_path):
    """A frame of 600 usual steps (over 1,024 phase ids in one run, drawn in chunks) and of
    runs broken by a step with asked ids, one with no phases and one between steps: the C
    path's fields, records handed over as failed and random state after, the Python's."""
    records, _, factory = _records(tmp_path)
    step = _flat(records)
    odd = _odd_shapes(step)
    shapes = _usual_shapes(step)
    frames = [[step] * 600,
              [step] * 550 + [shapes["asked ids"]] + [step] * 530 + [shapes["no phases"]]
              + [step] * 170 + [odd["between steps"]] + [step] * 5]
    assert len(step[9]) * 530 > 1024
    for frame in frames:
        outcomes = []
        for accelerated in (False, True):
            random.seed(8)
            failed: list = []
            fields = encode_frame(_Encoder(accelerated=accelerated), frame,
                                  factory.run_constants, lambda r, e: failed.append(r))
            outcomes.append((fields, failed, random.getrandbits(64)))
        assert outcomes[0] == outcomes[1]
        assert len(outcomes[1][0]) >= 600 * (len(step[9]) + 1)


@needs_c
def test_the_ids_a_run_draws_are_counted_in_c_as_in_python(tmp_path):
    """run_draws against span_fields._run_draws, from every start, over every shape of
    record: usual steps, ids asked (a dict, empty or not), no phases, between steps, tuple
    phases; None (the Python counts) for a shape it does not read."""
    from otel_train.export.otlp.span_fields import _run_draws

    records, _, _ = _records(tmp_path)
    step = _flat(records)
    shapes = _usual_shapes(step)
    frame = [step, shapes["tuple phases"], _with(step, ids={}), step, shapes["asked ids"],
             step, shapes["no phases"], step, step, _odd_shapes(step)["between steps"], step]
    count = encoding._encode_c.run_draws
    for k in range(len(frame) + 1):
        assert count(frame, k) == _run_draws(frame, k)
    assert count([list(step)], 0) is None and count([_with(step, ids=[1])], 0) is None
