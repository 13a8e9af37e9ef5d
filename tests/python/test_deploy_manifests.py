"""The packaging in deploy/, checked offline: every Kubernetes resource against the Kubernetes
schemas (kubernetes-validate, strict: unknown fields fail), every KServe resource against
KServe's own CRD schemas (vendored in deploy/kserve/crds), and both against the server they
run: each flag a container passes is one `tessera --help` knows, the autoscaler's metric is the
one the prometheus-adapter rule makes, and that rule's series are metrics the server exports.

The image (deploy/Dockerfile) is not built here: the machine has a Docker client but no engine.
"""

from __future__ import annotations

import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import REPO_ROOT, binary

DEPLOY = REPO_ROOT / "deploy"
KUBERNETES_VERSION = "1.33.0"
CRDS = DEPLOY / "kserve" / "crds"


def documents():
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if CRDS in path.parents:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield pytest.param(path, doc, id=f"{path.relative_to(DEPLOY)}:{doc['kind']}")


ALL = list(documents())


def crd_schema(api_version: str, kind: str) -> dict:
    group, version = api_version.split("/")
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            for v in crd["spec"]["versions"]:
                if v["name"] == version:
                    return v["schema"]["openAPIV3Schema"]
    raise LookupError(f"no vendored CRD for {api_version} {kind}")


def unknown_fields(doc, schema, where="") -> list[str]:
    """Fields of `doc` its schema does not name (the API server prunes them silently)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(doc, dict) and "properties" in schema:
        for key, value in doc.items():
            if key not in schema["properties"]:
                found.append(f"{where}.{key}")
            else:
                found += unknown_fields(value, schema["properties"][key], f"{where}.{key}")
    elif isinstance(doc, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in doc.items():
            found += unknown_fields(value, schema["additionalProperties"], f"{where}.{key}")
    elif isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            found += unknown_fields(item, schema["items"], f"{where}[{i}]")
    return found


def test_there_is_something_to_check():
    kinds = {doc["kind"] for _, doc in (p.values for p in ALL)}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap",
            "ClusterServingRuntime", "InferenceService"} <= kinds, kinds


@pytest.mark.parametrize("path,doc", ALL)
def test_each_resource_fits_its_schema(path, doc):
    if doc["apiVersion"].startswith("serving.kserve.io/"):
        schema = crd_schema(doc["apiVersion"], doc["kind"])
        jsonschema.validate(doc, schema)
        assert unknown_fields(doc, schema) == []
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def containers(doc) -> list[dict]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return pod.get("containers", [])


@pytest.mark.parametrize("path,doc", [p for p in ALL if containers(p.values[1])])
def test_every_flag_a_container_passes_is_one_the_server_takes(path, doc):
    help_text = subprocess.run([str(binary()), "--help"], capture_output=True, text=True,
                               check=True).stdout
    for container in containers(doc):
        for arg in container.get("args", []):
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert re.search(rf"(^|\s){re.escape(flag)}[\s=<]", help_text), \
                    f"{path.name}: {flag} is not a tessera flag"
        security = container.get("securityContext", {})
        assert security.get("readOnlyRootFilesystem") is True
        assert security.get("allowPrivilegeEscalation") is False


def test_kserve_finds_the_container_it_expects():
    runtime = next(doc for _, doc in (p.values for p in ALL) if doc["kind"] == "ClusterServingRuntime")
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    [container] = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    assert "--model-repository=/mnt/models" in container["args"]
    names = {doc["spec"]["predictor"]["model"]["runtime"]
             for _, doc in (p.values for p in ALL) if doc["kind"] == "InferenceService"}
    assert names == {runtime["metadata"]["name"]}


def test_the_autoscaler_scales_on_the_metric_the_adapter_rule_makes():
    hpa = next(doc for _, doc in (p.values for p in ALL) if doc["kind"] == "HorizontalPodAutoscaler")
    rules_map = next(doc for _, doc in (p.values for p in ALL)
                     if doc["kind"] == "ConfigMap" and "adapter" in doc["metadata"]["name"])
    rules = yaml.safe_load(rules_map["data"]["config.yaml"])["rules"]
    made = {rule["name"]["as"] for rule in rules}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] in made
    exported = (REPO_ROOT / "host" / "src" / "metrics.rs").read_text()
    for rule in rules:
        for series in re.findall(r"nv_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]):
            assert f'"{series}"' in exported or f"{series}" in exported, series


def test_the_service_names_grpc_h2c():
    service = next(doc for _, doc in (p.values for p in ALL) if doc["kind"] == "Service")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"http", "h2c", "metrics"}
    assert ports["h2c"]["appProtocol"] == "kubernetes.io/h2c"


def test_the_image_carries_the_pinned_onnx_runtime():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    pin = re.search(r'"onnxruntime==([0-9.]+)"', (REPO_ROOT / "scripts" / "setup-python.sh").read_text())
    assert pin, "setup-python.sh pins onnxruntime"
    assert f"onnxruntime=={pin[1]}" in dockerfile
    assert f"libonnxruntime.so.{pin[1]}" in dockerfile
    assert re.search(r"^USER 10001", dockerfile, re.M), "the image runs as non-root"
