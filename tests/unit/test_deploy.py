"""deploy/: every manifest parses and says what the deployment docs promise.

Checks the Dockerfile (build context, non-root, health check, no secrets), the compose
file (botd + Redis with AOF), the systemd unit (restart, drain timing, sandboxing; and
``systemd-analyze verify`` where that tool is installed), the Kubernetes manifests
(replicas, probes, non-root, read-only root, drain timing, cross-references) and that
the example configurations load with ``bot.config.load_config``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import PLAIN_ENV, BotdConfig, load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
SHUTDOWN_GRACE_S = BotdConfig().gateway.shutdown_grace_s
# After shutdown_grace_s botd cancels the runs still going and waits up to 10 s for them.
DRAIN_BUDGET_S = SHUTDOWN_GRACE_S + 10
SECRET_NAMES = ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN",
                "SLACK_SIGNING_SECRET")
# Shapes of real credentials that must never appear in deploy/.
CREDENTIAL_PATTERNS = [
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),  # OpenAI
    re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}"),  # Slack bot/user tokens
    re.compile(r"\bxapp-[A-Za-z0-9-]{10,}"),  # Slack app tokens
    re.compile(r"\b\d{6,12}:[A-Za-z0-9_-]{30,}"),  # Telegram bot tokens
]


def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No BOTD_* or plain secret variables from the caller's environment."""
    import os

    for name in list(os.environ):
        if name.startswith("BOTD_") or name in PLAIN_ENV:
            monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---- every YAML file --------------------------------------------------------------------


def test_deploy_has_the_expected_files() -> None:
    for rel in ("Dockerfile", "docker-compose.yml", "botd.service", "botd.example.yaml", "README.md",
                ".env.example", "lb/nginx.conf", "k8s/kustomization.yaml", "k8s/deployment.yaml",
                "k8s/service.yaml", "k8s/configmap.yaml", "k8s/secret.yaml", "k8s/redis.yaml",
                "k8s/pdb.yaml", "k8s/namespace.yaml", "k8s/ingress.yaml"):
        assert (DEPLOY / rel).is_file(), rel
    assert (REPO / ".dockerignore").is_file()


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_parses(path: Path) -> None:
    parsed = docs(path)
    assert parsed, f"{path} has no documents"
    for doc in parsed:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"


def test_no_credentials_in_deploy() -> None:
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != ".env"):
        text = path.read_text(encoding="utf-8")
        for pattern in CREDENTIAL_PATTERNS:
            assert not pattern.search(text), f"{path} contains something shaped like a credential"


# ---- Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_admits(rel: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; '!' re-includes."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    rel = rel.strip("/")
    admitted = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
            admitted = negate
    return admitted


def test_dockerfile_is_multi_stage_on_python_311_slim() -> None:
    instr = dockerfile_instructions()
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for word, rest in instr if word == "ARG" and "=" in rest}
    froms = [rest for word, rest in instr if word == "FROM"]
    assert len(froms) >= 2, "build and runtime stages"
    for image in froms:
        ref = image.split()[0]
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), ref)
        assert resolved == "python:3.11-slim", image
    copies_from_build = [rest for word, rest in instr if word == "COPY" and rest.startswith("--from=")]
    assert any("/opt/botd/.venv" in c for c in copies_from_build), "the runtime stage copies the venv"


def test_dockerfile_copy_sources_exist_and_pass_dockerignore() -> None:
    # The build context is the repository root (compose: context "..", dockerfile deploy/Dockerfile).
    sources: list[str] = []
    for word, rest in dockerfile_instructions():
        if word not in {"COPY", "ADD"} or "--from=" in rest:
            continue
        tokens = [t for t in shlex.split(rest) if not t.startswith("--")]
        sources.extend(tokens[:-1])
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"COPY source {src} is not in the build context"
        assert dockerignore_admits(src), f"COPY source {src} is excluded by .dockerignore"
    # Every top-level package the wheel is built from is copied in.
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    includes = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in includes}
    copied = {s.strip("/") for s in sources}
    assert packages <= copied, f"packages not copied into the image: {packages - copied}"
    assert project["project"]["readme"] in copied  # setuptools reads it to build the wheel
    assert "pyproject.toml" in copied


def test_dockerignore_keeps_local_state_and_secrets_out() -> None:
    for rel in (".git", ".venv", "workspace", "tests", "deploy/.env", ".env", "botd.yaml",
                "agent/__pycache__", "bench"):
        assert not dockerignore_admits(rel), rel
    for rel in ("pyproject.toml", "README.md", "agent/loop.py", "bot/cli.py"):
        assert dockerignore_admits(rel), rel


def test_dockerfile_runtime_contract() -> None:
    instr = dockerfile_instructions()
    last_from = max(i for i, (word, _) in enumerate(instr) if word == "FROM")
    runtime = instr[last_from:]

    def one(word: str) -> str:
        values = [rest for w, rest in runtime if w == word]
        assert values, f"runtime stage has no {word}"
        return values[-1]

    user = one("USER").split(":")[0]
    assert user not in {"root", "0"}, "runs as a non-root user"
    assert json.loads(one("ENTRYPOINT")) == ["botd"]
    assert json.loads(one("CMD")) == ["run"]
    assert one("STOPSIGNAL") == "SIGTERM"
    assert "8080" in one("EXPOSE").split()
    health = one("HEALTHCHECK")
    assert "/healthz" in health and "urllib" in health and "curl" not in health
    env = " ".join(rest for w, rest in runtime if w == "ENV")
    assert "BOTD_HTTP__HOST=0.0.0.0" in env
    assert "BOTD_CONFIG=/etc/botd/botd.yaml" in env
    assert "BOTD_AGENT__WORKSPACE=/data/workspace" in env
    assert "/data/workspace" in one("VOLUME")
    # The console script really is `botd`.
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "botd" in project["project"]["scripts"]


def test_dockerfile_has_no_secrets() -> None:
    for word, rest in dockerfile_instructions():
        if word in {"ENV", "ARG", "LABEL"}:
            upper = rest.upper()
            for name in (*SECRET_NAMES, "PASSWORD", "REDIS_URL"):
                assert name not in upper, f"{word} {rest}: secrets come from the environment at run time"


# ---- docker compose -----------------------------------------------------------------------


def compose() -> dict[str, Any]:
    (doc,) = docs(DEPLOY / "docker-compose.yml")
    return doc


def seconds(value: str | int) -> float:
    if isinstance(value, int):
        return float(value)
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def test_compose_redis_has_aof_on_a_volume() -> None:
    services = compose()["services"]
    assert {"botd", "redis"} <= set(services)
    redis = services["redis"]
    command = redis["command"]
    argv = command if isinstance(command, list) else shlex.split(command)
    flat = " ".join(str(a) for a in argv)
    assert "--appendonly yes" in flat
    assert "--maxmemory-policy noeviction" in flat
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert redis["volumes"][0].split(":")[0] in compose()["volumes"]
    assert redis["healthcheck"]["test"]
    assert "ports" not in redis, "Redis stays on the compose network"


def test_compose_botd_service() -> None:
    doc = compose()
    botd = doc["services"]["botd"]
    assert botd["environment"]["REDIS_URL"] == "redis://redis:6379/0"
    assert botd["env_file"] == [".env"] or botd["env_file"] == ".env"
    assert botd["depends_on"]["redis"]["condition"] == "service_healthy"
    assert botd["restart"] == "unless-stopped"
    assert "/healthz" in " ".join(botd["healthcheck"]["test"])
    assert botd["environment"]["BOTD_HTTP__HOST"] == "0.0.0.0"
    assert seconds(botd["stop_grace_period"]) > DRAIN_BUDGET_S
    # Config mounted read-only at BOTD_CONFIG; its default source is the example config.
    config_mounts = [v for v in botd["volumes"] if ":/etc/botd/botd.yaml" in v]
    assert len(config_mounts) == 1 and config_mounts[0].endswith(":ro")
    default_src = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", config_mounts[0].rsplit(":", 2)[0])
    assert (DEPLOY / default_src).is_file()
    assert any(v.endswith(":/data/workspace") for v in botd["volumes"])
    # Built from the repository root with deploy/Dockerfile.
    build = botd["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    # No published host port: `--scale botd=N` would clash on it; the lb publishes instead.
    assert "ports" not in botd
    assert botd.get("read_only") is True and "ALL" in botd["cap_drop"]


def test_compose_load_balancer_for_scale_out() -> None:
    lb = compose()["services"]["lb"]
    assert lb["profiles"] == ["lb"]
    mounts = [v.split(":")[0] for v in lb["volumes"]]
    for src in mounts:
        assert (DEPLOY / src).is_file(), src
    conf = (DEPLOY / "lb" / "nginx.conf").read_text(encoding="utf-8")
    cfg = BotdConfig()
    assert cfg.telegram.webhook_path in conf and cfg.slack.events_path in conf
    assert "127.0.0.11" in conf, "re-resolves the botd replicas through Docker's DNS"


def test_env_example_documents_the_secrets() -> None:
    text = (DEPLOY / ".env.example").read_text(encoding="utf-8")
    keys = dict(
        line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#")
    )
    for name in SECRET_NAMES:
        assert name in keys, name
        assert keys[name] == "", f"{name} must be empty in the example"
    assert ".env" in (DEPLOY / ".gitignore").read_text(encoding="utf-8").split()


# ---- systemd ------------------------------------------------------------------------------


def unit() -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file as section -> [(key, value)], repeated keys kept in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in (DEPLOY / "botd.service").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not key=value: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def service() -> dict[str, str]:
    return dict(unit()["Service"])


def test_systemd_unit_sections_and_start() -> None:
    sections = unit()
    assert {"Unit", "Service", "Install"} <= set(sections)
    svc = service()
    assert svc["Type"] == "simple"  # botd does not speak sd_notify
    exec_start = shlex.split(svc["ExecStart"])
    assert exec_start[0] == "/opt/botd/.venv/bin/botd" and "run" in exec_start
    env = [v for k, v in sections["Service"] if k == "Environment"]
    assert "BOTD_CONFIG=/etc/botd/botd.yaml" in env or "--config" in exec_start
    assert svc["User"] == "botd"
    assert svc["EnvironmentFile"] == "-/etc/botd/botd.env"
    assert svc["WorkingDirectory"] == "/var/lib/botd"
    assert dict(sections["Install"])["WantedBy"] == "multi-user.target"


def test_systemd_unit_restart_and_drain() -> None:
    svc = service()
    assert svc["Restart"] == "on-failure"
    assert seconds(svc["RestartSec"] + ("s" if svc["RestartSec"].isdigit() else "")) > 0
    assert svc["KillMode"] == "mixed"  # SIGTERM to botd only; the embedded Valkey stops after the drain
    stop = svc["TimeoutStopSec"]
    assert seconds(stop + ("s" if stop.isdigit() else "")) > DRAIN_BUDGET_S
    assert "2" in svc.get("RestartPreventExitStatus", "").split()  # config errors do not loop
    assert svc["MemoryMax"]


def test_systemd_unit_sandboxing() -> None:
    svc = service()
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "read-only",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictSUIDSGID": "yes",
        # The tool sandbox needs exactly these namespaces (bubblewrap), nothing more.
        "RestrictNamespaces": "user pid net ipc uts mnt",
        "SystemCallArchitectures": "native",
    }
    for key, value in expected.items():
        assert svc.get(key) == value, f"{key}={svc.get(key)!r}, expected {value}"
    assert set(svc["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    writable = {p.lstrip("-") for p in svc["ReadWritePaths"].split()}
    assert writable == {"/var/lib/botd", "/tmp/botd"}
    assert svc["CapabilityBoundingSet"] == ""


def _unit_for_verification(tmp_path: Path) -> Path:
    # verify insists that ExecStart exists and is executable: point it at a real binary.
    true = shutil.which("true") or "/bin/true"
    text = (DEPLOY / "botd.service").read_text(encoding="utf-8").replace("/opt/botd/.venv/bin/botd", true)
    path = tmp_path / "botd.service"
    path.write_text(text, encoding="utf-8")
    return path


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd); the structural checks above still ran")
    path = _unit_for_verification(tmp_path)
    proc = subprocess.run([tool, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    # Unknown keys and unparsable values are only warnings (exit 0): fail on any line about the unit.
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if "botd.service" in line]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    path = _unit_for_verification(tmp_path)
    proc = subprocess.run([tool, "security", "--offline=yes", "--threshold=30", str(path)],
                          capture_output=True, text=True, timeout=60)
    if "offline" in proc.stderr and "unrecognized" in proc.stderr:
        pytest.skip("this systemd-analyze has no offline security analysis (systemd < 250)")
    assert proc.returncode == 0, "overall exposure above 3.0:\n" + proc.stdout[-2000:] + proc.stderr


# ---- Kubernetes ---------------------------------------------------------------------------


def k8s_objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in docs(path):
            yield path, doc


def objects_of(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_objects() if doc.get("kind") == kind]


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects_of(kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def cluster_config() -> str:
    return str(the("ConfigMap", "botd-config")["data"]["botd.yaml"])


def test_k8s_kinds_and_namespace() -> None:
    kinds = {doc["kind"] for _, doc in k8s_objects()}
    assert {"Namespace", "Secret", "ConfigMap", "Deployment", "Service", "StatefulSet",
            "PodDisruptionBudget", "Kustomization"} <= kinds
    for path, doc in k8s_objects():
        assert doc.get("apiVersion"), f"{path}: apiVersion"
        if doc["kind"] not in {"Namespace", "Kustomization"}:
            assert doc["metadata"].get("namespace") == "botd", f"{path}: {doc['kind']} namespace"


def test_k8s_kustomization_lists_every_manifest_but_the_secret_template() -> None:
    kustomization = the("Kustomization")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk - {"secret.yaml"}
    assert kustomization["namespace"] == "botd"


def test_k8s_deployment_scale_out_probes_and_security() -> None:
    deployment = the("Deployment", "botd")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports or container[probe]["httpGet"]["port"] in ports.values()
    assert ports["http"] == 8080
    for c in [*pod["containers"], *pod.get("initContainers", [])]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # Writable places under a read-only root: /tmp and the workspace are volumes.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in ("/tmp", "/data/workspace"):
        assert path in mounts, path
        assert "emptyDir" in volumes[mounts[path]] or "persistentVolumeClaim" in volumes[mounts[path]]
    assert volumes[mounts["/etc/botd"]]["configMap"]["name"] == "botd-config"
    env = {e["name"]: e for e in container["env"]}
    assert env["BOTD_CONFIG"]["value"] == "/etc/botd/botd.yaml"
    assert env["BOTD_HTTP__HOST"]["value"] == "0.0.0.0"
    assert env["REDIS_URL"]["value"].startswith("redis://")
    assert "botd-redis:6379" in env["REDIS_URL"]["value"]


def test_k8s_termination_grace_exceeds_the_drain() -> None:
    pod = the("Deployment", "botd")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = yaml.safe_load(cluster_config())["gateway"]["shutdown_grace_s"]
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + grace + 10


def test_k8s_references_resolve() -> None:
    secret = the("Secret", "botd-secrets")
    secret_keys = set(secret["stringData"])
    config_maps = {c["metadata"]["name"] for c in objects_of("ConfigMap")}
    for workload in [*objects_of("Deployment"), *objects_of("StatefulSet")]:
        pod = workload["spec"]["template"]["spec"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for c in [*pod["containers"], *pod.get("initContainers", [])]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "botd-secrets" and ref["key"] in secret_keys, ref
            for ef in c.get("envFrom", []):
                assert ef["secretRef"]["name"] == "botd-secrets"
            mounted = {m["name"] for m in c.get("volumeMounts", [])}
            declared = {v["name"] for v in pod.get("volumes", [])} | {
                t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])
            }
            assert mounted <= declared, c["name"]
        for v in pod.get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in config_maps
    deployment = the("Deployment", "botd")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    botd_service = the("Service", "botd")
    assert botd_service["spec"]["selector"].items() <= pod_labels.items()
    assert the("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert the("PodDisruptionBudget")["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    redis_service = the("Service", "botd-redis")
    redis_pod = the("StatefulSet", "botd-redis")["spec"]["template"]["metadata"]["labels"]
    assert redis_service["spec"]["selector"].items() <= redis_pod.items()
    assert not (redis_service["spec"]["selector"].items() <= pod_labels.items())
    for rule in the("Ingress")["spec"]["rules"]:
        for p in rule["http"]["paths"]:
            assert p["backend"]["service"]["name"] == "botd"


def test_k8s_secret_holds_placeholders_only() -> None:
    secret = the("Secret", "botd-secrets")
    assert "data" not in secret, "stringData placeholders, no base64 blobs"
    for key, value in secret["stringData"].items():
        assert value == "" or str(value).startswith("CHANGE-ME"), f"{key} must be a placeholder"
    for name in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET",
                 "REDIS_PASSWORD"):
        assert name in secret["stringData"], name


def test_k8s_redis_statefulset_with_aof() -> None:
    statefulset = the("StatefulSet", "botd-redis")
    assert statefulset["spec"]["serviceName"] == "botd-redis"
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = " ".join(str(a) for a in [*container.get("command", []), *container.get("args", [])])
    assert "--appendonly yes" in argv
    assert "--maxmemory-policy noeviction" in argv
    assert "--requirepass $(REDIS_PASSWORD)" in argv
    data_dir = argv.split("--dir ")[1].split()[0]
    claims = {t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]}
    assert any(m["mountPath"] == data_dir and m["name"] in claims for m in container["volumeMounts"])
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_k8s_config_uses_http_mode_channels_and_loads(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text(cluster_config(), encoding="utf-8")
    clean_env.setenv("TELEGRAM_BOT_TOKEN", "123456:placeholder")
    clean_env.setenv("SLACK_BOT_TOKEN", "placeholder-bot-token")
    clean_env.setenv("SLACK_SIGNING_SECRET", "placeholder-signing-secret")
    clean_env.setenv("OPENAI_API_KEY", "placeholder-api-key")
    cfg = load_config(path)
    assert cfg.telegram.enabled and cfg.telegram.mode == "webhook"
    assert cfg.slack.enabled and cfg.slack.mode == "http"
    assert cfg.http.host == "0.0.0.0" and cfg.http.port == 8080
    ingress_paths = {p["path"] for r in the("Ingress")["spec"]["rules"] for p in r["http"]["paths"]}
    assert ingress_paths == {cfg.telegram.webhook_path, cfg.slack.events_path}
    assert cfg.telegram.webhook_url and cfg.telegram.webhook_url.endswith(cfg.telegram.webhook_path)


# ---- the example configuration ------------------------------------------------------------


def test_example_config_loads_as_is(clean_env: pytest.MonkeyPatch) -> None:
    cfg = load_config(DEPLOY / "botd.example.yaml")
    assert cfg.agent.workspace == Path("/data/workspace")
    assert cfg.gateway.shutdown_grace_s == SHUTDOWN_GRACE_S
    assert cfg.redis.url is None and cfg.llm.api_key is None  # nothing secret in the file


def test_example_config_with_channels_enabled_from_env(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("BOTD_TELEGRAM__ENABLED", "true")
    clean_env.setenv("TELEGRAM_BOT_TOKEN", "123456:placeholder")
    clean_env.setenv("BOTD_SLACK__ENABLED", "true")
    clean_env.setenv("SLACK_BOT_TOKEN", "placeholder-bot-token")
    clean_env.setenv("SLACK_APP_TOKEN", "placeholder-app-token")
    clean_env.setenv("REDIS_URL", "redis://redis:6379/0")
    cfg = load_config(DEPLOY / "botd.example.yaml")
    assert cfg.telegram.enabled and cfg.slack.enabled
    assert cfg.redis.url == "redis://redis:6379/0"


# ---- docs ---------------------------------------------------------------------------------


def test_deploy_readme_explains_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name not in {".env", ".gitignore"}):
        rel = path.relative_to(DEPLOY).as_posix()
        assert rel in readme or path.name in readme, f"deploy/README.md does not mention {rel}"
    assert ".dockerignore" in readme
    top = (REPO / "README.md").read_text(encoding="utf-8")
    assert "## Deployment and scale-out" in top


# ---- pinned versions, the Slack manifest, systemd's workspace -----------------------------


def constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (DEPLOY / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"not an exact pin: {line}"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_constraints_pin_every_runtime_dependency_inside_its_range() -> None:
    from packaging.requirements import Requirement

    pins = constraints()
    assert "botd" not in pins, "the project itself is not pinned"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    for spec in project["project"]["dependencies"]:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} has no pin in deploy/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {spec}"
    run = " ".join(rest for word, rest in dockerfile_instructions() if word == "RUN")
    assert "-c /tmp/constraints.txt" in run


def test_slack_manifest_matches_what_botd_handles() -> None:
    (manifest,) = docs(DEPLOY / "slack-app-manifest.yaml")
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"app_mentions:read", "im:history", "chat:write", "reactions:write", "commands"} <= scopes
    assert {"app_mention", "message.im"} <= set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/botd"]
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    text = (DEPLOY / "slack-app-manifest.yaml").read_text(encoding="utf-8")
    assert text.count(f"example.com{BotdConfig().slack.events_path}") == 3  # the HTTP variant's URLs


def test_systemd_workspace_is_in_a_writable_path() -> None:
    sections = unit()
    env = dict(v.split("=", 1) for k, v in sections["Service"] if k == "Environment")
    workspace = env["BOTD_AGENT__WORKSPACE"]
    writable = {p.lstrip("-") for p in service()["ReadWritePaths"].split()}
    assert any(workspace == w or workspace.startswith(w + "/") for w in writable), workspace
