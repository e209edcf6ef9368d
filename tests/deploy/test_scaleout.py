"""deploy/otel-collector-fleet.yaml, deploy/kubernetes/, deploy/slurm/: structural checks.

No Collector, Kubernetes or Slurm here, so the files are checked for what makes them work with
the library and with each other: they load, pipelines are wired to defined components with the
memory limiter first, ports agree with the library's defaults (OTLP 4317/4318, metrics 9464 +
local rank) and across files, selectors select what they should, images are pinned.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import DEPLOY, load_yaml

from otel_train.common.options import DEFAULT_PROMETHEUS_PORT

pytestmark = pytest.mark.timeout(60)

FLEET = DEPLOY / "otel-collector-fleet.yaml"
K8S = DEPLOY / "kubernetes"
SBATCH = DEPLOY / "slurm" / "otel-train.sbatch"
OTLP_GRPC, OTLP_HTTP = 4317, 4318  # the OTLP exporters' default ports
RANKS_PER_POD = 8


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for f in sorted(K8S.glob("*.yaml")) for d in _docs(f.name) if d["kind"] == kind]


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].split("/")[0])


def _check_collector_config(cfg: dict[str, Any], where: str) -> None:
    service = cfg["service"]
    for signal, pipe in service["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipe.get(kind, []):
                assert name in cfg[kind], f"{where}: {signal} uses undefined {kind[:-1]} {name}"
        procs = pipe["processors"]
        assert procs[0] == "memory_limiter", f"{where}: {signal}: memory_limiter must come first"
        assert procs[-1].startswith("batch"), f"{where}: {signal}: batch must come last"
    protocols = cfg["receivers"]["otlp"]["protocols"]
    assert _port(protocols["grpc"]["endpoint"]) == OTLP_GRPC
    assert _port(protocols["http"]["endpoint"]) == OTLP_HTTP
    for ext in service.get("extensions", []):
        assert ext in cfg["extensions"]


def test_fleet_collector_receives_both_signals_and_sends_traces_to_tempo_metrics_to_prometheus():
    cfg = load_yaml(FLEET)
    _check_collector_config(cfg, "fleet")
    pipes = cfg["service"]["pipelines"]
    assert set(pipes) == {"traces", "metrics"}
    (traces_out,) = pipes["traces"]["exporters"]
    tempo = load_yaml(DEPLOY / "tempo.yaml")
    tempo_grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert traces_out.startswith("otlp")
    assert _port(cfg["exporters"][traces_out]["endpoint"]) == _port(tempo_grpc)
    assert cfg["exporters"][traces_out]["sending_queue"]["queue_size"] > 0  # bounded
    (metrics_out,) = pipes["metrics"]["exporters"]
    assert metrics_out == "prometheusremotewrite"
    assert cfg["exporters"][metrics_out]["endpoint"].endswith(":9090/api/v1/write")
    # rank and run_id are data-point attributes: no resource-to-label explosion
    assert cfg["exporters"][metrics_out]["resource_to_telemetry_conversion"]["enabled"] is False


def test_every_kubernetes_manifest_loads_with_the_required_fields_and_pinned_images():
    files = sorted(K8S.glob("*.yaml"))
    assert {f.name for f in files} >= {"podmonitor.yaml", "servicemonitor.yaml",
                                       "otel-collector-agent.yaml",
                                       "otel-collector-gateway.yaml", "training-job.yaml"}
    for f in files:
        for doc in _docs(f.name):
            assert doc.get("apiVersion") and doc.get("kind"), f.name
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", doc["metadata"]["name"])
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                assert re.fullmatch(r"[\w./-]+:[\w.-]+", c["image"]) and ":latest" not in c["image"]
                for p in c.get("ports", []):
                    if "name" in p:
                        assert len(p["name"]) <= 15, p  # IANA_SVC_NAME


def _training_container() -> dict[str, Any]:
    (job,) = _by_kind("Job")
    return job["spec"]["template"]["spec"]["containers"][0]


def test_training_pods_expose_one_metrics_port_per_local_rank_at_the_library_default():
    container = _training_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {f"otel-train-{r}": DEFAULT_PROMETHEUS_PORT + r
                     for r in range(RANKS_PER_POD)}
    env = {e["name"]: e for e in container["env"]}
    assert env["OTEL_TRAIN_PROMETHEUS_HOST"]["value"] == "0.0.0.0"  # reachable by Prometheus
    nproc = next(a for a in container["command"] if a.startswith("--nproc-per-node="))
    assert int(nproc.split("=")[1]) == RANKS_PER_POD


def test_podmonitor_and_servicemonitor_scrape_every_rank_port_of_the_training_pods():
    (job,) = _by_kind("Job")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in _training_container()["ports"]}
    (pm,) = _by_kind("PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == port_names
    assert all(e["path"] == "/metrics" for e in pm["spec"]["podMetricsEndpoints"])
    (sm,) = _by_kind("ServiceMonitor")
    services = [s for s in _by_kind("Service")
                if sm["spec"]["selector"]["matchLabels"].items()
                <= s["metadata"].get("labels", {}).items()]
    assert len(services) == 1
    svc = services[0]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= set(svc_ports)
    for name in (e["port"] for e in sm["spec"]["endpoints"]):
        assert svc_ports[name] == DEFAULT_PROMETHEUS_PORT + int(name.rsplit("-", 1)[1])
    # The rendezvous endpoint in the command resolves through this headless Service.
    assert svc["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == svc["metadata"]["name"]


def test_the_agent_daemonset_listens_where_training_pods_send_and_forwards_by_trace_id():
    (ds,) = _by_kind("DaemonSet")
    (cm,) = [c for c in _by_kind("ConfigMap") if c["metadata"]["name"] == "otel-collector-agent"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    _check_collector_config(cfg, "agent")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    host_ports = {p["hostPort"] for p in container["ports"] if "hostPort" in p}
    assert host_ports == {OTLP_GRPC, OTLP_HTTP}
    assert any(v["configMap"]["name"] == "otel-collector-agent" for v in pod["volumes"])
    assert pod["serviceAccountName"] == "otel-collector-agent"
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    gw_service = lb["resolver"]["k8s"]["service"].split(".")[0]
    # Training pods send to their node's agent with the library's OTLP settings.
    env = {e["name"]: e for e in _training_container()["env"]}
    endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"]
    assert endpoint == "http://$(NODE_IP):4317" and env["OTEL_EXPORTER_OTLP_PROTOCOL"][
        "value"] == "grpc"
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert "otlp" in env["OTEL_METRICS_EXPORTER"]["value"].split(",")
    assert "k8s.job.name=$(JOB_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    # ... and the gateway it forwards to is the headless Service running the fleet config.
    (gw,) = [s for s in _by_kind("Service") if s["metadata"]["name"] == gw_service]
    assert gw["spec"]["clusterIP"] == "None"
    assert OTLP_GRPC in {p["port"] for p in gw["spec"]["ports"]}
    (dep,) = _by_kind("Deployment")
    assert dep["spec"]["selector"]["matchLabels"].items() <= gw["spec"]["selector"].items()
    gateway_cm = dep["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    gateway_doc = (K8S / "otel-collector-gateway.yaml").read_text()
    assert f"create configmap -n monitoring {gateway_cm}" in gateway_doc
    assert "deploy/otel-collector-fleet.yaml" in gateway_doc


def test_the_slurm_example_is_valid_bash_and_uses_the_library_defaults():
    text = SBATCH.read_text()
    bash = shutil.which("bash")
    assert bash
    subprocess.run([bash, "-n", str(SBATCH)], check=True)
    assert text.startswith("#!/bin/bash")
    assert re.search(r"^#SBATCH --nodes=\d+$", text, re.MULTILINE)
    assert f"PROMETHEUS_PORT={DEFAULT_PROMETHEUS_PORT}" in text
    assert f"OTLP_PORT={OTLP_GRPC}" in text
    assert '--rdzv-id="$SLURM_JOB_ID"' in text  # every rank's run id: TORCHELASTIC_RUN_ID
    assert "OTEL_METRICS_EXPORTER=otlp" in text
    assert "deploy/otel-collector-fleet.yaml" in text and FLEET.exists()


def test_the_slurm_example_writes_file_sd_targets_prometheus_can_read(tmp_path: Path):
    # Run the target-writing part with fake Slurm commands.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'gpu-a\\ngpu-b\\n'\n")
    (bin_dir / "srun").write_text("#!/bin/bash\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    targets = tmp_path / "targets"
    targets.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "4711",
           "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_NAME": "t", "SLURM_NNODES": "2",
           "PROMETHEUS_TARGETS_DIR": str(targets)}
    # Keep the file: drop the EXIT trap for this check.
    script = SBATCH.read_text().replace("trap 'rm -f \"$targets\"' EXIT", ":")
    subprocess.run(["bash", "-c", script, "sbatch", "train.py"], env=env, check=True,
                   timeout=30)
    groups = load_yaml(targets / "otel-train-4711.yml")
    assert groups[0]["labels"] == {"slurm_job_id": "4711"}
    assert groups[0]["targets"] == [f"{n}:{DEFAULT_PROMETHEUS_PORT + r}"
                                    for n in ("gpu-a", "gpu-b") for r in range(8)]
