"""``python -m otel_train.cli``: the same as the ``otel-train`` command."""

from __future__ import annotations

import sys

from otel_train.cli.main import main

sys.exit(main())
