"""Loading Pod manifests for ``runtime-proxy play`` and the command's exit codes."""

from __future__ import annotations

import json
import socket
import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from kubernetes.client import V1Pod

from runtimeproxy.kubelet_model.manifest import (
    ManifestError,
    derive_pod_uid,
    load_pod,
    parse_pod_text,
    parse_quantity_value,
)
from runtimeproxy.play.command import play_command
from runtimeproxy.play.cri_client import unix_socket_path, unix_socket_served

PODS = Path(__file__).parents[1] / "data" / "pods"

MINIMAL = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
    - name: app
      image: localhost/runtimeproxy-testbed/busybox:1
"""


def _pod(body: str) -> str:
    """A manifest with `body` (YAML for the container list's first item) inserted."""
    return MINIMAL + textwrap.indent(textwrap.dedent(body), "      ")


def _error(text: str) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        parse_pod_text(text, "pod.yaml")
    return info.value


# -- good manifests ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ls-pod", "be-pod", "guaranteed-pod"])
def test_example_pods_load(name: str) -> None:
    pod = load_pod(PODS / f"{name}.yaml")
    assert isinstance(pod, V1Pod)
    assert pod.metadata.name == name
    assert pod.spec.host_network is True
    assert all(c.image == "localhost/runtimeproxy-testbed/busybox:1" for c in pod.spec.containers)


def test_example_pods_carry_koordinator_labels() -> None:
    assert load_pod(PODS / "ls-pod.yaml").metadata.labels["koordinator.sh/qosClass"] == "LS"
    assert load_pod(PODS / "be-pod.yaml").metadata.labels["koordinator.sh/qosClass"] == "BE"


def test_minimal_pod_gets_namespace_and_stable_uid() -> None:
    first = parse_pod_text(MINIMAL, "pod.yaml")
    second = parse_pod_text(MINIMAL, "other.yaml")
    assert first.metadata.namespace == "default"
    assert first.metadata.uid == second.metadata.uid == derive_pod_uid("default", "web")
    assert uuid.UUID(first.metadata.uid).version == 4


def test_uid_depends_on_namespace_and_name() -> None:
    assert derive_pod_uid("default", "web") != derive_pod_uid("other", "web")
    assert derive_pod_uid("default", "web") != derive_pod_uid("default", "web2")


def test_explicit_uid_is_kept() -> None:
    text = MINIMAL.replace("  name: web\n", "  name: web\n  uid: 1234-abcd\n")
    assert parse_pod_text(text).metadata.uid == "1234-abcd"


def test_fields_are_deserialized() -> None:
    pod = parse_pod_text(
        _pod(
            """\
            command: ["sh", "-c"]
            args: ["echo $(A)"]
            workingDir: /tmp
            env:
              - name: A
                value: "x=y"
            resources:
              limits: {cpu: 1, memory: 1Gi}
            securityContext:
              privileged: true
              runAsUser: 1000
            """
        )
    )
    container = pod.spec.containers[0]
    assert container.command == ["sh", "-c"]
    assert container.env[0].value == "x=y"
    assert container.resources.limits == {"cpu": "1", "memory": "1Gi"}
    assert container.security_context.run_as_user == 1000
    assert container.working_dir == "/tmp"


def test_list_with_one_pod() -> None:
    text = "apiVersion: v1\nkind: List\nitems:\n" + textwrap.indent("- " + MINIMAL.replace("\n", "\n  ").rstrip(), "")
    pod = parse_pod_text(text)
    assert pod.metadata.name == "web"


def test_stream_with_one_pod_and_empty_documents() -> None:
    pod = parse_pod_text("---\n" + MINIMAL + "---\n")
    assert pod.metadata.name == "web"


# -- quantities -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("100m", "0.1"), ("1", "1"), ("1Gi", "1073741824"), ("1e3", "1000"), ("0.5", "0.5")],
)
def test_quantities(text: str, value: str) -> None:
    from decimal import Decimal

    assert parse_quantity_value(text) == Decimal(value)


@pytest.mark.parametrize("text", ["abc", "1.5.5", "", "inf", "1_000", "-1", "Gi", True, None])
def test_bad_quantities(text: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity_value(text)


# -- bad manifests: each names the file and the field -----------------------------------


@pytest.mark.parametrize(
    ("name", "field", "reason"),
    [
        ("bad-quantity", "spec.containers[1].resources.limits.cpu", 'invalid quantity "abc"'),
        ("bad-duplicate-names", "spec.containers[1].name", "duplicate container name"),
        (
            "bad-limits-below-requests",
            "spec.containers[0].resources.requests.memory",
            "less than or equal to the limit",
        ),
        ("bad-two-pods", "", "exactly one Pod"),
    ],
)
def test_bad_example_files(name: str, field: str, reason: str) -> None:
    path = PODS / f"{name}.yaml"
    with pytest.raises(ManifestError) as info:
        load_pod(path)
    error = info.value
    assert error.source == str(path)
    assert error.field == field
    assert reason in error.reason
    assert str(error).startswith(f"{path}: ")


def test_error_message_format() -> None:
    error = _error(_pod("resources:\n  limits:\n    cpu: abc\n"))
    assert str(error) == 'pod.yaml: spec.containers[0].resources.limits.cpu: invalid quantity "abc"'
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (MINIMAL.replace("kind: Pod", "kind: Deployment"), "kind", "Deployment"),
        (MINIMAL.replace("apiVersion: v1", "apiVersion: apps/v1"), "apiVersion", '"v1"'),
        (MINIMAL.replace("  name: web\n", ""), "metadata.name", "missing"),
        (MINIMAL.replace("name: web", "name: Web_1"), "metadata.name", "not a valid name"),
        (
            MINIMAL.replace("  name: web\n", "  name: web\n  namespace: 'a b'\n"),
            "metadata.namespace",
            "not a valid namespace",
        ),
        (
            MINIMAL.replace("  name: web\n", "  name: web\n  labels: {a: 1}\n"),
            "metadata.labels.a",
            "expected a string",
        ),
        (
            MINIMAL.split("spec:")[0] + "spec:\n  containers: []\n",
            "spec.containers",
            "at least one container",
        ),
        (MINIMAL.split("spec:")[0], "spec", "missing"),
        (
            MINIMAL.replace("      image: localhost/runtimeproxy-testbed/busybox:1\n", ""),
            "spec.containers[0].image",
            "missing",
        ),
        (
            MINIMAL.replace("image: localhost/runtimeproxy-testbed/busybox:1", "image: ''"),
            "spec.containers[0].image",
            "empty",
        ),
        (
            MINIMAL.replace("name: app", "name: App"),
            "spec.containers[0].name",
            "not a valid container name",
        ),
        (
            _pod("env:\n  - name: A\n    valueFrom: {secretKeyRef: {name: s, key: k}}\n"),
            "spec.containers[0].env[0].valueFrom",
            "secretKeyRef is not supported",
        ),
        (
            _pod("env:\n  - name: A\n    valueFrom: {fieldRef: {fieldPath: status.phase}}\n"),
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            "not supported",
        ),
        (
            _pod("env:\n  - name: A\n    valueFrom: {fieldRef: {fieldPath: status.podIP}}\n"),
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            "hostNetwork",
        ),
        (
            _pod("env:\n  - name: A\n    value: 1\n"),
            "spec.containers[0].env[0].value",
            "expected a string",
        ),
        (
            _pod("envFrom:\n  - configMapRef: {name: x}\n"),
            "spec.containers[0].envFrom",
            "not supported",
        ),
        (_pod("command: sleep\n"), "spec.containers[0].command", "expected a list"),
        (_pod("command: [sleep, 10]\n"), "spec.containers[0].command[1]", "expected a string"),
        (
            _pod("resources:\n  requests:\n    memory: -1Mi\n"),
            "spec.containers[0].resources.requests.memory",
            "negative",
        ),
        (
            _pod("resources:\n  requests: {cpu: 2}\n  limits: {cpu: 1}\n"),
            "spec.containers[0].resources.requests.cpu",
            "less than or equal",
        ),
        (
            _pod("volumeMounts:\n  - {name: data, mountPath: /data}\n"),
            "spec.containers[0].volumeMounts[0].name",
            "no volume named",
        ),
        (
            _pod("securityContext:\n  privileged: 'yes'\n"),
            "spec.containers[0].securityContext.privileged",
            "true or false",
        ),
        (
            MINIMAL + "  volumes:\n    - name: data\n      secret: {secretName: s}\n",
            "spec.volumes[0]",
            "secret is not supported",
        ),
        (
            MINIMAL + "  volumes:\n    - name: data\n      emptyDir: {medium: HugePages}\n",
            "spec.volumes[0].emptyDir.medium",
            "not supported",
        ),
        (
            MINIMAL + "  volumes:\n    - name: data\n      emptyDir: {sizeLimit: lots}\n",
            "spec.volumes[0].emptyDir.sizeLimit",
            "invalid quantity",
        ),
        (
            MINIMAL + "  volumes:\n    - name: data\n      hostPath: {path: /x, type: Folder}\n",
            "spec.volumes[0].hostPath.type",
            "unknown hostPath type",
        ),
        (
            MINIMAL + "  volumes:\n    - name: p\n      configMap: {name: c, items: [{key: k, path: ../x}]}\n",
            "spec.volumes[0].configMap.items[0].path",
            "without '..'",
        ),
        (
            MINIMAL + "  volumes:\n    - name: p\n      configMap: {name: c, defaultMode: 4095}\n",
            "spec.volumes[0].configMap.defaultMode",
            "file mode",
        ),
        (
            MINIMAL + "  volumes:\n    - name: p\n      configMap: {defaultMode: 420}\n",
            "spec.volumes[0].configMap.name",
            "missing",
        ),
        (
            _pod("securityContext:\n  capabilities: {add: [1]}\n"),
            "spec.containers[0].securityContext.capabilities.add[0]",
            "expected a string",
        ),
        (
            _pod("securityContext:\n  seccompProfile: {type: Strict}\n"),
            "spec.containers[0].securityContext.seccompProfile.type",
            "unknown seccomp profile type",
        ),
        (
            MINIMAL.replace("  name: web\n", "  name: web\n  uid: ../../etc\n"),
            "metadata.uid",
            "not a valid uid",
        ),
        (
            MINIMAL + "  initContainers:\n    - name: app\n      image: x\n",
            "spec.containers[0].name",  # init containers are checked first
            "duplicate container name",
        ),
        (MINIMAL + "  hostNetwork: 'true'\n", "spec.hostNetwork", "true or false"),
    ],
)
def test_malformed_manifests(text: str, field: str, reason: str) -> None:
    error = _error(text)
    assert error.field == field, str(error)
    assert reason in error.reason, str(error)
    assert str(error).startswith("pod.yaml: ")


def test_not_yaml() -> None:
    error = _error("apiVersion: v1\nkind: [unclosed\n")
    assert "invalid YAML" in str(error)


def test_empty_file() -> None:
    assert "empty" in str(_error("# nothing\n"))


def test_not_a_mapping() -> None:
    assert "expected a mapping" in str(_error("- a\n- b\n"))


def test_list_of_two_pods() -> None:
    item = "- " + MINIMAL.replace("\n", "\n  ").rstrip()
    text = "apiVersion: v1\nkind: List\nitems:\n" + item + "\n" + item.replace("web", "web2")
    assert "exactly one Pod or DaemonSet, found 2: Pod \"web\", Pod \"web2\"" in str(_error(text))


def test_list_item_of_another_kind() -> None:
    text = "apiVersion: v1\nkind: List\nitems:\n  - {apiVersion: v1, kind: Service}\n"
    error = _error(text)
    assert error.field == "items[0].kind"


def test_list_item_field_paths_are_prefixed() -> None:
    item = "- " + MINIMAL.replace("\n", "\n  ").rstrip().replace("name: app", "name: A")
    error = _error("apiVersion: v1\nkind: List\nitems:\n" + item)
    assert error.field == "items[0].spec.containers[0].name"


def test_stream_reports_document_number() -> None:
    text = MINIMAL + "---\napiVersion: v1\nkind: ConfigMap\n"
    error = _error(text)
    assert error.source == "pod.yaml (document 2)"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        load_pod(tmp_path / "nope.yaml")
    assert "cannot read manifest" in str(info.value)


# -- the command ----------------------------------------------------------------------------


def test_command_bad_manifest_exits_2_without_traceback() -> None:
    result = CliRunner().invoke(play_command, [str(PODS / "bad-quantity.yaml")])
    assert result.exit_code == 2
    assert 'spec.containers[1].resources.limits.cpu: invalid quantity "abc"' in result.stderr
    assert "Traceback" not in result.output


def test_command_bad_manifest_json() -> None:
    result = CliRunner().invoke(play_command, [str(PODS / "bad-duplicate-names.yaml"), "-o", "json"])
    assert result.exit_code == 2
    body = json.loads(result.stdout)
    assert body["ok"] is False
    assert body["error"]["field"] == "spec.containers[1].name"


def test_command_dry_run_prints_requests_as_text(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        play_command, [str(PODS / "ls-pod.yaml"), "--dry-run", "-o", "text", "--log-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert not result.stdout.lstrip().startswith("{")
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run (play): nothing is sent"
    assert "qos=Burstable" in lines[1]
    assert "RunPodSandbox:" in lines and any(line.startswith("CreateContainer app ") for line in lines)
    assert '      value: "LS"' in lines  # the koordinator QoS label, in protobuf text


def test_command_dry_run_prints_requests_as_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        play_command, [str(PODS / "ls-pod.yaml"), "--dry-run", "-o", "json", "--log-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["pod"]["qos_class"] == "Burstable"
    config = body["run_pod_sandbox"]["config"]
    assert config["labels"]["koordinator.sh/qosClass"] == "LS"
    assert config["log_directory"].startswith(str(tmp_path))
    assert body["create_container"][0]["config"]["metadata"]["name"] == "app"


def test_command_unreachable_endpoint_exits_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        play_command,
        [
            str(PODS / "be-pod.yaml"),
            "--endpoint",
            str(tmp_path / "none.sock"),
            "--timeout",
            "2",
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert body["error"]["code"] == "UNAVAILABLE"
    assert "UNAVAILABLE" in result.stderr
    assert "Traceback" not in result.output
    assert "runtime-proxy serve" in body["error"]["hint"] and "--endpoint" in body["error"]["hint"]
    assert f"hint: nothing serves {tmp_path / 'none.sock'}" in result.stderr


def test_command_unavailable_from_a_live_server_gives_no_hint(tmp_path: Path) -> None:
    # Something listens but is no CRI server: the failure is not "nothing serves the socket".
    path = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()
        result = CliRunner().invoke(
            play_command, [str(PODS / "be-pod.yaml"), "--endpoint", str(path), "--timeout", "1", "-o", "json"]
        )
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert body["error"]["code"] in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
    assert "hint" not in body["error"] and "hint:" not in result.stderr


@pytest.mark.parametrize(
    ("endpoint", "path"),
    [
        ("/run/x.sock", "/run/x.sock"),
        ("unix:///run/x.sock", "/run/x.sock"),
        ("unix:/run/x.sock", "/run/x.sock"),
        ("unix-abstract:x", None),
        ("dns:///host:1", None),
    ],
)
def test_unix_socket_path(endpoint: str, path: str | None) -> None:
    assert unix_socket_path(endpoint) == path


def test_unix_socket_served(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    assert unix_socket_served(str(path)) is False  # missing
    path.write_text("")
    assert unix_socket_served(str(path)) is False  # not a socket
    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        assert unix_socket_served(str(path)) is False  # bound, not listening: refused
        listener.listen()
        assert unix_socket_served(f"unix://{path}") is True
    assert unix_socket_served("dns:///host:1") is None
