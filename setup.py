"""Builds the optional C accelerator of the hot path (otel_train/recording/_recorder_c*.c).

Everything else is in pyproject.toml. Where no C compiler (or no Python headers) is found,
the build goes on without it and otel-train runs its pure-Python twin
(otel_train/recording/pure_twin.py): ``optional=True``.
"""

from setuptools import Extension, setup

_SOURCES = ["otel_train/recording/_recorder_c.c", "otel_train/recording/_recorder_c_phase.c",
            "otel_train/recording/_recorder_c_step.c", "otel_train/recording/_recorder_c_loop.c",
            "otel_train/recording/_recorder_c_rows.c",
            "otel_train/recording/_recorder_c_ring.c"]

setup(ext_modules=[Extension("otel_train.recording._recorder_c", _SOURCES,
                             depends=["otel_train/recording/_recorder_c.h"], optional=True)])
