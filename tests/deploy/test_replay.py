"""deploy/otel-collector-replay.yaml: the otlpjsonfile receiver finds every span file a run
writes (each rank, each rotated file), reads it as otel-train writes it (gzip, whole lines),
and its pipeline ships to the compose stack's Tempo. Checked structurally (no Collector here)."""

from __future__ import annotations

import fnmatch
import re

from deploy_support import DEPLOY, load_yaml
from deploy_support import port_of, services
from train_helpers import clean_env, start_test_run  # noqa: F401

from otel_train.common.options import RunOptions

REPLAY = DEPLOY / "otel-collector-replay.yaml"


def _size_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB)?", str(text))
    assert m, text
    return int(m.group(1)) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, None: 1}[
        m.group(2)]


def test_the_receiver_reads_every_rank_and_rotated_file_of_a_run_as_written(tmp_path):
    conf = load_yaml(REPLAY)
    receiver = conf["receivers"]["otlpjsonfile"]
    assert receiver["start_at"] == "beginning"
    assert receiver["compression"] == "gzip" == RunOptions.resolve(environ={}).spans_compression
    for rank in (0, 1):  # a real two-rank run, its files rotated every few lines
        with start_test_run(tmp_path, spans_path=None, rank=rank, world_size=2,
                            spans_file_max_bytes=2000, export_batch_size=16) as run:
            for step in run.steps(range(40)):
                with step.phase("forward"):
                    pass
    names = sorted(p.name for p in tmp_path.glob("spans*"))
    assert any(".1.jsonl.gz" in n for n in names) and any("rank1" in n for n in names)
    globs = [g.replace("/run-dir/", "") for g in receiver["include"]]
    for name in names:
        assert any(fnmatch.fnmatch(name, g) for g in globs), name
    # One line is one export batch: the default batch's line fits the receiver's line limit.
    assert _size_bytes(receiver["max_log_size"]) >= 512 * 2000


def test_the_pipeline_ships_the_files_to_the_compose_stacks_tempo():
    conf = load_yaml(REPLAY)
    (pipeline,) = conf["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlpjsonfile"]
    for name in pipeline["processors"]:
        assert name in conf["processors"]
    (exporter,) = pipeline["exporters"]
    assert exporter in conf["exporters"]
    endpoint = conf["exporters"][exporter]["endpoint"]
    host = endpoint.split(":")[0]
    assert host in services() and port_of(endpoint) == 4317
    text = REPLAY.read_text()
    # The documented command mounts the run directory where include looks, on the stack's
    # network (the compose project is named otel-train).
    assert ':/run-dir:ro"' in text and "--network otel-train_default" in text
    assert load_yaml(DEPLOY / "docker-compose.yaml")["name"] == "otel-train"
