"""Builds the optional C accelerators: the hot path's (otel_train/recording/_recorder_c*.c)
and the exporter process's OTLP span encoder (otel_train/export/otlp/_encode_c.c).

Everything else is in pyproject.toml. Where no C compiler (or no Python headers) is found,
the build goes on without them and otel-train runs their pure-Python twins
(otel_train/recording/pure_twin.py, otel_train/export/otlp/encoding.py): ``optional=True``.
"""

from setuptools import Extension, setup

_SOURCES = ["otel_train/recording/_recorder_c.c", "otel_train/recording/_recorder_c_phase.c",
            "otel_train/recording/_recorder_c_step.c", "otel_train/recording/_recorder_c_loop.c",
            "otel_train/recording/_recorder_c_rows.c",
            "otel_train/recording/_recorder_c_ringrows.c",
            "otel_train/recording/_recorder_c_ringids.c",
            "otel_train/recording/_recorder_c_ring.c",
            "otel_train/recording/_recorder_c_ringread.c"]

setup(ext_modules=[Extension("otel_train.recording._recorder_c", _SOURCES,
                             depends=["otel_train/recording/_recorder_c.h"], optional=True),
                   Extension("otel_train.export.otlp._encode_c",
                             ["otel_train/export/otlp/_encode_c.c",
                              "otel_train/export/otlp/_encode_c_span.c",
                              "otel_train/export/otlp/_encode_c_wire.c"],
                             depends=["otel_train/export/otlp/_encode_c.h"], optional=True)])
