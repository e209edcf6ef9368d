"""deploy/docker-compose.yaml, otel-collector.yaml, tempo.yaml: structural cross-checks.

No Docker engine, Collector or Tempo binary is available here, so the files are checked for what
makes them work together: every mounted file exists, ports agree across files, pipelines are
wired, and Grafana's datasource URLs point at the compose services.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from deploy_support import DEPLOY, PROVISIONING, load_yaml, port_of, published, services

pytestmark = pytest.mark.timeout(60)

def test_compose_has_the_four_services() -> None:
    assert {"otel-collector", "tempo", "prometheus", "grafana"} <= set(services())
    for name, svc in services().items():
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", svc["image"]), f"{name}: pin an image tag"
        assert "latest" not in svc["image"]


def test_every_mounted_file_exists() -> None:
    for name, svc in services().items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                path = (DEPLOY / source).resolve()
                assert path.exists(), f"{name}: mounts missing {source}"


def test_published_ports_bind_loopback_only() -> None:
    for name, svc in services().items():
        for container_port, binding in published(svc).items():
            assert binding.startswith("127.0.0.1:"), f"{name}:{container_port} -> {binding}"


def test_prometheus_service_uses_our_config_rules_and_exemplars() -> None:
    prom = services()["prometheus"]
    assert "--enable-feature=exemplar-storage" in prom["command"]
    config_flag = next(c for c in prom["command"] if c.startswith("--config.file="))
    config_in_container = config_flag.split("=", 1)[1]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    mount_dir = str(Path(config_in_container).parent)
    assert mounts[mount_dir] == "./prometheus"
    assert (DEPLOY / "prometheus" / Path(config_in_container).name).exists()
    assert 9090 in published(prom)
    # the training host is reachable as host.docker.internal (targets/otel-train.yml uses it)
    assert any("host.docker.internal:host-gateway" in h for h in prom["extra_hosts"])
    targets = load_yaml(DEPLOY / "prometheus" / "targets" / "otel-train.yml")
    assert all(t.startswith("host.docker.internal:") for g in targets for t in g["targets"])


def test_prometheus_scrapes_the_collector_on_its_ports() -> None:
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = {t for sc in jobs["otel-collector"]["static_configs"] for t in sc["targets"]}
    collector = load_yaml(DEPLOY / "otel-collector.yaml")
    exporter_port = port_of(collector["exporters"]["prometheus"]["endpoint"])
    telemetry = collector["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]
    assert targets == {
        f"otel-collector:{telemetry['prometheus']['port']}",
        f"otel-collector:{exporter_port}",
    }


def test_collector_pipelines_are_wired() -> None:
    col = load_yaml(DEPLOY / "otel-collector.yaml")
    pipelines = col["service"]["pipelines"]
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in col[kind], f"{component} is not defined under {kind}"
    assert pipelines["traces"]["receivers"] == ["otlp"]
    assert "otlp/tempo" in pipelines["traces"]["exporters"]
    assert "prometheus" in pipelines["metrics"]["exporters"]
    for ext in col["service"].get("extensions", []):
        assert ext in col["extensions"]


def test_collector_ports_agree_with_compose() -> None:
    col = load_yaml(DEPLOY / "otel-collector.yaml")
    protocols = col["receivers"]["otlp"]["protocols"]
    ports = published(services()["otel-collector"])
    assert port_of(protocols["grpc"]["endpoint"]) == 4317 and 4317 in ports
    assert port_of(protocols["http"]["endpoint"]) == 4318 and 4318 in ports
    # the collector reaches Tempo's OTLP gRPC receiver by service name
    tempo_endpoint = col["exporters"]["otlp/tempo"]["endpoint"]
    host, port = tempo_endpoint.rsplit(":", 1)
    assert host == "tempo" and host in services()
    tempo = load_yaml(DEPLOY / "tempo.yaml")
    assert int(port) == port_of(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    health = col["extensions"]["health_check"]["endpoint"]
    assert port_of(health) in ports


def test_tempo_config_matches_compose_and_grafana() -> None:
    tempo = load_yaml(DEPLOY / "tempo.yaml")
    http_port = tempo["server"]["http_listen_port"]
    assert http_port in published(services()["tempo"])
    storage = tempo["storage"]["trace"]
    assert storage["backend"] == "local"
    mounts = [v.split(":")[1] for v in services()["tempo"]["volumes"]]
    assert any(storage["local"]["path"].startswith(m) for m in mounts)
    cmd = " ".join(services()["tempo"]["command"])
    config_path = cmd.split("-config.file=")[1].split()[0]
    assert any(v.endswith(f":{config_path}:ro") for v in services()["tempo"]["volumes"])


def test_grafana_datasource_urls_point_at_compose_services() -> None:
    ds = {d["type"]: d for d in load_yaml(PROVISIONING / "datasources" / "datasources.yaml")["datasources"]}
    tempo_port = load_yaml(DEPLOY / "tempo.yaml")["server"]["http_listen_port"]
    assert ds["tempo"]["url"] == f"http://tempo:{tempo_port}"
    assert ds["prometheus"]["url"] == "http://prometheus:9090"


def test_grafana_mounts_all_provisioning_and_dashboards() -> None:
    graf = services()["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in graf["volumes"]}
    for kind in ("datasources", "dashboards", "alerting"):
        assert mounts[f"./grafana/provisioning/{kind}"] == f"/etc/grafana/provisioning/{kind}"
    provider = load_yaml(PROVISIONING / "dashboards" / "dashboards.yaml")["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (DEPLOY / "grafana" / "dashboards" / Path(home).name).exists()
    assert 3000 in published(graf)


def test_readme_five_minutes_section_matches_files() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert re.search(r"^#+ .*see it in Grafana in five minutes", readme, re.I | re.M)
    assert "docker compose -f deploy/docker-compose.yaml up" in readme
    assert "OTEL_TRAIN_PROMETHEUS_HOST=0.0.0.0" in readme
    assert "http://127.0.0.1:3000" in readme
