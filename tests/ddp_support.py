"""Two real gloo ranks under DDP on CPU, started without torchrun (one torch import less).

``DdpRanks`` starts ``python tests/ddp_child.py`` once per rank with the ``env://`` variables
torch.distributed reads (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``); each rank
prints one JSON line with its Prometheus URL. Used by tests/integrations/test_comm.py and
tests/deploy/test_ddp_stragglers.py.

Usage::

    with DdpRanks(tmp_path, env, ["--steps", "30"]) as ranks:
        ranks.wait_urls(timeout=60)
        ranks.wait(timeout=60)            # both ranks ran their steps and exited
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CHILD = Path(__file__).resolve().parent / "ddp_child.py"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DdpRanks:
    """``world_size`` rank processes of one gloo job; a context manager that ends them."""

    def __init__(self, workdir: Path, env: dict[str, str], args: list[str],
                 world_size: int = 2) -> None:
        port = str(free_port())
        self.procs: list[subprocess.Popen[str]] = []
        self.stderr_paths = [workdir / f"rank{r}.stderr" for r in range(world_size)]
        self._lines: list[queue.Queue[str]] = []
        self.hostports: list[str] = []
        for rank in range(world_size):
            rank_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                            WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                            OMP_NUM_THREADS="1")
            with open(self.stderr_paths[rank], "wb") as err:
                proc = subprocess.Popen([sys.executable, str(CHILD), *args],
                                        stdout=subprocess.PIPE, stderr=err,
                                        stdin=subprocess.DEVNULL, env=rank_env, cwd=workdir,
                                        text=True)
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
            self.procs.append(proc)
            self._lines.append(lines)

    def wait_urls(self, timeout: float) -> list[str]:
        """Every rank's metrics ``host:port``, in rank order."""
        deadline = time.monotonic() + timeout
        for rank, lines in enumerate(self._lines):
            while True:
                try:
                    line = lines.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                except queue.Empty:
                    if self.procs[rank].poll() is not None or time.monotonic() > deadline:
                        raise AssertionError(f"rank {rank} reported no URL:\n{self.stderr(rank)}")
                    continue
                if line.startswith("{"):
                    url = json.loads(line)["prometheus_url"]
                    self.hostports.append(url.removeprefix("http://").rstrip("/"))
                    break
        return self.hostports

    def wait(self, timeout: float) -> list[int]:
        """Exit codes once every rank ended by itself."""
        deadline = time.monotonic() + timeout
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]

    def stderr(self, rank: int) -> str:
        return self.stderr_paths[rank].read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM every rank at once (no rank is left waiting in an all-reduce), then kill."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> DdpRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The test process's environment for a rank, without OTEL_/torchrun variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env
