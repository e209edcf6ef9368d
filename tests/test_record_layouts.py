"""Span records, rows and phases are plain tuples read by named positions.

The layouts are defined in ``records/span_rows.py`` (``R_*`` a span row of 14, ``C_*`` a span
record of 11, ``P_*`` a record's phase of 12, the first six from ``records/steps_view.py``).
They stay tuples (``marshal`` carries them down the pipe, the C recorder builds them), so the
names are the only thing that says what a position holds.

The rule this test checks, read from the source (AST): outside the two modules that define
the layouts, no subscript by an integer literal (``x[6]``, ``x[-1]``, or a slice with a literal
bound, ``x[:10]``) of a value that by the package's naming convention is a record, row or
phase: a name in :data:`RECORD_NAMES`, or an item of a name in :data:`RECORD_SEQUENCES`
(``phases[i][7]``). Code that holds some other tuple under one of those names renames it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from time import perf_counter_ns

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from train_helpers import clean_env, nested_step  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.recording.recorder import Recorder, Step
from otel_train.records import span_rows, steps_view
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns

PACKAGE = Path(__file__).resolve().parent.parent / "otel_train"
LAYOUT_MODULES = {"records/span_rows.py", "records/steps_view.py"}
RECORD_NAMES = frozenset({"rec", "record", "row", "span_row", "ph", "phase", "phase_rec"})
RECORD_SEQUENCES = frozenset({"phases", "rows", "records", "recs"})


def _is_int_literal(node: ast.AST | None) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_record(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in RECORD_NAMES
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id in RECORD_SEQUENCES)


def bare_index_reads(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, expression) of every read of a record position by an integer literal."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Subscript) or not _is_record(node.value):
            continue
        index = node.slice
        literal = (_is_int_literal(index) if not isinstance(index, ast.Slice)
                   else any(_is_int_literal(b) for b in (index.lower, index.upper)))
        if literal:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reads_a_record_position_by_a_bare_index():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in LAYOUT_MODULES:
            continue
        offenders += [f"otel_train/{rel}:{line}: {text}"
                      for line, text in bare_index_reads(path.read_text(), str(path))]
    assert not offenders, ("read record positions by their names (records/span_rows.py "
                           "R_*, C_*, P_*):\n" + "\n".join(offenders))


@pytest.mark.parametrize("source", [
    "rec[6].update(x)", "ph[-1]", "row[12]", "phases[i][7]", "marked = ph[:10] + rest",
    "record[9]",
])
def test_the_rule_rejects_a_record_read_by_a_literal(source):
    assert bare_index_reads(source)


@pytest.mark.parametrize("source", [
    "rec[C_ATTRS]", "ph[P_EXTRA]", "phases[i][P_END]", "ph[:P_EXTRA] + ph[P_EXTRA + 1:]",
    "totals[0] += 1", "rows[0]", "phase_names[0]",
])
def test_the_rule_accepts_named_positions_and_other_values(source):
    assert not bare_index_reads(source)


def test_the_layouts_number_every_position_once():
    assert (span_rows.R_NAME, span_rows.R_LINKS) == (0, 13)
    assert (span_rows.C_NAME, span_rows.C_IDS) == (0, 10)
    assert span_rows.PHASE_LAYOUT == tuple(range(span_rows.PHASE_FIELDS))
    # The first six positions of a record's phase are a StepView phase's.
    assert span_rows.P_PARENT_ID == steps_view.P_PARENT_ID == span_rows.P_START - 1


def _flat_step(rec: Recorder) -> Step:
    """Phases one after another: the builder's fast path (C when built, else Python)."""
    step = Step(rec, 7, "train", rec.phase("data", "train"))
    step.ev.extend((perf_counter_ns(), None))  # as run.steps closes the data phase
    for name in ("forward", "backward"):
        with step.phase(name):
            pass
    step._finish(None)
    return step


@pytest.mark.parametrize("path", ["nested", "flat", "flat_python"])
def test_a_built_step_record_reads_back_by_its_named_positions(path, monkeypatch):
    """The builder's record (decoder, C fast path, Python fast path) has the layout."""
    import otel_train.records.step_records as sb

    if path == "flat_python":
        monkeypatch.setattr(sb, "_flat_rows", sb._flat_phases)
    ident = RunIdentity("run-layout", rank=0, world_size=1, local_rank=0,
                        run_id_source="option")
    builder = StepRecordBuilder(ident, Resource.create({"service.name": "layout"}),
                                InstrumentationScope("otel_train", "0.1.0"), False, "cpu",
                                lambda tid: True, epoch_offset_ns())
    recorder = Recorder(10, DropCounter(), None)
    step = nested_step(recorder) if path == "nested" else _flat_step(recorder)
    rec = builder.record(step)
    assert type(rec) is tuple and len(rec) == span_rows.C_IDS + 1
    assert rec[span_rows.C_NAME] == "train.step"
    assert rec[span_rows.C_START] <= rec[span_rows.C_END]
    phases = rec[span_rows.C_PHASES]
    assert [ph[span_rows.P_NAME] for ph in phases] == (
        ["forward", "attention", "inference"] if path == "nested"
        else ["data", "forward", "backward"])
    for ph in phases:
        assert type(ph) is tuple and len(ph) == span_rows.PHASE_FIELDS
        assert ph[span_rows.P_START] <= ph[span_rows.P_END]
        assert ph[span_rows.P_DURATION] == ph[span_rows.P_END] - ph[span_rows.P_START]
        assert ph[span_rows.P_STATUS] is None and ph[span_rows.P_EVENTS] in (None, ())
        assert ph[span_rows.P_EXTRA] is None or isinstance(ph[span_rows.P_EXTRA], dict)
    rows = span_rows.rows_from_record(rec)
    assert all(len(r) == span_rows.R_LINKS + 1 for r in rows)
    assert rows[-1][span_rows.R_NAME] == "train.step"
