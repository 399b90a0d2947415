"""``runtime-proxy play`` of a DaemonSet with its ConfigMaps: the pod its controller makes, its
volumes as kubelet lays them out, its environment and security context as CRI fields."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.kubelet_model.manifest import (
    ConfigMap,
    ManifestError,
    derive_pod_uid,
    parse_config_maps_text,
    parse_input_text,
)
from runtimeproxy.kubelet_model.pod_plan import NodeFacts, build_plan
from runtimeproxy.kubelet_model.volumes import PodSetupError, VolumePlan
from runtimeproxy.kubelet_model.workloads import GENERATED_NAME_ALPHABET
from runtimeproxy.play import volumes
from runtimeproxy.play.command import play_command

POLICY_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: policy, namespace: infra}
data:
  policy.yaml: |
    cpu: {BE: {cpu_idle: true}}
  other: "x"
binaryData:
  blob: AAEC
"""
DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: hooks, namespace: infra}
spec:
  selector: {matchLabels: {app: hooks}}
  template:
    metadata:
      labels: {app: hooks}
      annotations: {note: kept}
    spec:
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      hostNetwork: true
      securityContext: {seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: main
          image: localhost/runtimeproxy-testbed/busybox:1
          env:
            - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
            - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
            - {name: FROM_MAP, valueFrom: {configMapKeyRef: {name: policy, key: other}}}
            - {name: GONE, valueFrom: {configMapKeyRef: {name: policy, key: none, optional: true}}}
            - {name: AGAIN, value: "$(POD)-x"}
          readinessProbe: {httpGet: {path: /metrics, port: 9317}}
          ports: [{name: metrics, containerPort: 9317}]
          securityContext:
            runAsUser: 0
            privileged: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL], add: [NET_ADMIN]}
          volumeMounts:
            - {name: policy, mountPath: /etc/policy}
            - {name: some, mountPath: /etc/some}
            - {name: cgroup, mountPath: /host/sys/fs/cgroup, mountPropagation: HostToContainer}
            - {name: tmp, mountPath: /tmp}
            - {name: disk, mountPath: /scratch}
      volumes:
        - {name: policy, configMap: {name: policy}}
        - name: some
          configMap:
            name: policy
            defaultMode: 0600
            items: [{key: policy.yaml, path: sub/p.yaml, mode: 0640}]
        - {name: cgroup, hostPath: {path: /sys/fs/cgroup, type: Directory}}
        - {name: tmp, emptyDir: {medium: Memory, sizeLimit: 16Mi}}
        - {name: disk, emptyDir: {}}
"""
INPUT = DAEMONSET + "---\n" + POLICY_MAP
NODE = NodeFacts(node_name="node-1", node_ip="10.0.0.7")


def _plan(text: str = INPUT, node: str = "node-1", root: str = "/var/lib/kubelet") -> object:
    loaded = parse_input_text(text, "in.yaml", node_name=node)
    facts = NodeFacts(node_name=node, node_ip="10.0.0.7", config_maps=loaded.config_maps)
    return build_plan(loaded.pod, log_dir_base="/logs", machine_memory=4 << 30, kubelet_root=root, node=facts)


# -- the pod the controller makes ---------------------------------------------------------


def test_daemonset_pod_identity() -> None:
    loaded = parse_input_text(INPUT, "in.yaml", node_name="node-1")
    meta = loaded.pod.metadata
    assert loaded.derived_from == "DaemonSet infra/hooks"
    assert meta.namespace == "infra"
    prefix, suffix = meta.name.rsplit("-", 1)
    assert prefix == "hooks" and len(suffix) == 5 and set(suffix) <= set(GENERATED_NAME_ALPHABET)
    assert meta.uid == derive_pod_uid("infra", meta.name)
    assert meta.labels["app"] == "hooks" and meta.labels["pod-template-generation"] == "1"
    assert meta.labels["controller-revision-hash"]
    assert meta.annotations == {"note": "kept"}
    assert meta.owner_references[0].kind == "DaemonSet" and meta.owner_references[0].name == "hooks"
    assert loaded.pod.spec.node_name == "node-1"
    assert set(loaded.config_maps) == {"policy"}


def test_daemonset_pod_is_stable_per_node_and_template() -> None:
    first = parse_input_text(INPUT, "in.yaml", node_name="node-1").pod.metadata
    again = parse_input_text(INPUT, "in.yaml", node_name="node-1").pod.metadata
    other = parse_input_text(INPUT, "in.yaml", node_name="node-2").pod.metadata
    changed = parse_input_text(INPUT.replace("busybox:1", "busybox:2"), "in.yaml", node_name="node-1").pod.metadata
    assert (first.name, first.uid) == (again.name, again.uid)
    assert first.name != other.name and first.uid != other.uid
    assert changed.labels["controller-revision-hash"] != first.labels["controller-revision-hash"]


_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@settings(max_examples=50, deadline=None)
@given(st.lists(_LABEL, min_size=1, max_size=12).map(".".join).filter(lambda n: len(n) <= 253), _LABEL)
def test_any_daemonset_name_gives_a_valid_pod_name(name: str, node: str) -> None:
    loaded = parse_input_text(INPUT.replace("name: hooks, namespace", f"name: '{name}', namespace"), "in.yaml",
                              node_name=node)
    pod_name = loaded.pod.metadata.name
    assert len(pod_name) <= 63 and pod_name.startswith(f"{name}-"[:58])
    assert loaded.derived_from == f"DaemonSet infra/{name}"


def test_daemonset_errors_name_the_template_field() -> None:
    with pytest.raises(ManifestError) as info:
        parse_input_text(INPUT.replace("- name: main", "- name: Main"), "in.yaml", node_name="n")
    assert info.value.field == "spec.template.spec.containers[0].name"
    assert info.value.source == "in.yaml (document 1)"


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (DAEMONSET.replace("kind: DaemonSet", "kind: Deployment"), "kind", 'got "Deployment"'),
        (DAEMONSET.replace("apps/v1", "extensions/v1beta1"), "apiVersion", '"apps/v1"'),
        (DAEMONSET.split("  template:")[0], "spec.template", "missing"),
        (POLICY_MAP, "", "found 0"),
        (DAEMONSET + "---\n" + DAEMONSET, "", 'found 2: DaemonSet "hooks", DaemonSet "hooks"'),
        (INPUT.replace("  blob: AAEC", "  blob: '***'"), "binaryData.blob", "not base64"),
        (INPUT.replace("  other:", "  'a/b':"), "data.a/b", "not a valid ConfigMap key"),
    ],
)
def test_bad_inputs(text: str, field: str, reason: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_input_text(text, "in.yaml", node_name="n")
    assert info.value.field == field, str(info.value)
    assert reason in info.value.reason, str(info.value)


def test_config_maps_only_file() -> None:
    maps = parse_config_maps_text(POLICY_MAP, "maps.yaml")
    assert maps["policy"].files == {"policy.yaml": b"cpu: {BE: {cpu_idle: true}}\n", "other": b"x", "blob": b"\0\1\2"}
    with pytest.raises(ManifestError, match="expected only ConfigMaps"):
        parse_config_maps_text(DAEMONSET, "maps.yaml")


# -- what kubelet sends for it -------------------------------------------------------------


def test_volumes_as_kubelet_lays_them_out() -> None:
    plan = _plan(root="/k")
    uid = plan.uid  # type: ignore[attr-defined]
    by_name = {volume.name: volume for volume in plan.volumes}  # type: ignore[attr-defined]
    base = f"/k/pods/{uid}/volumes"
    assert by_name["policy"].path == f"{base}/kubernetes.io~configmap/policy"
    assert by_name["policy"].files["policy.yaml"] == (b"cpu: {BE: {cpu_idle: true}}\n", 0o644)
    assert set(by_name["policy"].files) == {"policy.yaml", "other", "blob"}
    assert by_name["some"].files == {"sub/p.yaml": (b"cpu: {BE: {cpu_idle: true}}\n", 0o640)}
    assert by_name["tmp"] == VolumePlan("tmp", "emptyDir", f"{base}/kubernetes.io~empty-dir/tmp", memory=True,
                                        size_limit=16 << 20)
    assert not by_name["disk"].memory and by_name["disk"].size_limit is None
    assert by_name["cgroup"].path == "/sys/fs/cgroup" and by_name["cgroup"].host_path_type == "Directory"
    mounts = {m.container_path: m for m in plan.containers[0].config.mounts}  # type: ignore[attr-defined]
    assert mounts["/etc/policy"].readonly and mounts["/etc/some"].readonly  # configMap: always read-only
    assert not mounts["/tmp"].readonly and mounts["/tmp"].host_path == by_name["tmp"].path
    assert mounts["/host/sys/fs/cgroup"].propagation == cri.PROPAGATION_HOST_TO_CONTAINER
    assert mounts["/etc/policy"].propagation == cri.PROPAGATION_PRIVATE


def test_environment_from_the_downward_api_and_config_maps() -> None:
    plan = _plan()
    envs = plan.containers[0].config.envs  # type: ignore[attr-defined]
    env = {kv.key: kv.value.decode() if isinstance(kv.value, bytes) else kv.value for kv in envs}
    name = plan.name  # type: ignore[attr-defined]
    assert env == {"NODE": "node-1", "POD": name, "APP": "hooks", "HOST_IP": "10.0.0.7", "FROM_MAP": "x",
                   "AGAIN": f"{name}-x"}


def test_security_context_fields() -> None:
    plan = _plan()
    context = plan.containers[0].config.linux.security_context  # type: ignore[attr-defined]
    assert list(context.capabilities.drop_capabilities) == ["ALL"]
    assert list(context.capabilities.add_capabilities) == ["NET_ADMIN"]
    assert context.HasField("run_as_user") and context.run_as_user.value == 0
    assert context.readonly_rootfs and context.no_new_privs and not context.privileged
    assert context.seccomp.profile_type == cri.SecurityProfile.RuntimeDefault
    sandbox = plan.sandbox_config.linux.security_context  # type: ignore[attr-defined]
    assert sandbox.seccomp.profile_type == cri.SecurityProfile.RuntimeDefault
    assert [p.container_port for p in plan.sandbox_config.port_mappings] == [9317]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (DAEMONSET, "configmap 'policy' not found"),
        (INPUT.replace("key: policy.yaml, path", "key: nope, path"), "has no key 'nope'"),
        (INPUT.replace("key: other}", "key: other2}"), "key 'other2' not found"),
    ],
)
def test_unresolvable_references_fail_before_anything_starts(text: str, message: str) -> None:
    with pytest.raises(PodSetupError, match=message):
        _plan(text)


def test_optional_config_map_may_be_missing() -> None:
    text = DAEMONSET.replace("configMap: {name: policy}", "configMap: {name: policy, optional: true}")
    text = text.replace("items: [", "optional: true\n            items: [")
    text = text.replace("key: other}", "key: other, optional: true}")
    plan = _plan(text)
    assert {v.name: v.files for v in plan.volumes}["policy"] == {}  # type: ignore[attr-defined]


def test_host_ip_needs_the_node_address() -> None:
    loaded = parse_input_text(INPUT, "in.yaml", node_name="n")
    with pytest.raises(PodSetupError, match="--node-ip"):
        build_plan(loaded.pod, log_dir_base="/l", machine_memory=1 << 30,
                   node=NodeFacts(node_name="n", config_maps=loaded.config_maps))


# -- setting the volumes up on the node ------------------------------------------------------


def _config_volume(path: Path, files: dict[str, bytes], mode: int = 0o644) -> VolumePlan:
    return VolumePlan("cm", "configMap", str(path), files={k: (v, mode) for k, v in files.items()})


def test_config_map_atomic_writer_layout(tmp_path: Path) -> None:
    target = tmp_path / "cm"
    volumes.set_up([_config_volume(target, {"a.yaml": b"1", "dir/b": b"2"}, 0o600)])
    data = target / "..data"
    assert data.is_symlink() and os.readlink(data).startswith("..")
    stamped = target / os.readlink(data)
    assert stamped.is_dir() and not (target / "..data_tmp").exists()
    assert os.readlink(target / "a.yaml") == "..data/a.yaml" and os.readlink(target / "dir") == "..data/dir"
    assert (target / "a.yaml").read_bytes() == b"1" and (target / "dir" / "b").read_bytes() == b"2"
    assert stat.S_IMODE((stamped / "a.yaml").stat().st_mode) == 0o600


def test_config_map_update_swaps_data_and_drops_old_keys(tmp_path: Path) -> None:
    target = tmp_path / "cm"
    volumes.set_up([_config_volume(target, {"a": b"1", "b": b"2"})])
    first = os.readlink(target / "..data")
    volumes.set_up([_config_volume(target, {"a": b"3"})])
    assert os.readlink(target / "..data") != first and not (target / first).exists()
    assert (target / "a").read_bytes() == b"3" and not os.path.lexists(target / "b")


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "b.yaml", "c-1", "d_2", "e"]), st.binary(max_size=16), max_size=5),
        min_size=1,
        max_size=4,
    )
)
def test_config_map_writes_show_exactly_the_last_data(tmp_path_factory: pytest.TempPathFactory,
                                                      writes: list[dict[str, bytes]]) -> None:
    target = tmp_path_factory.mktemp("cm") / "v"
    for files in writes:
        volumes.set_up([_config_volume(target, files)])
    visible = {name: (target / name).read_bytes() for name in os.listdir(target) if not name.startswith("..")}
    assert visible == writes[-1]
    assert [name for name in os.listdir(target) if name.startswith("..") and name != "..data"] == [
        os.readlink(target / "..data")
    ]


def test_host_path_types(tmp_path: Path) -> None:
    made = tmp_path / "made"
    note = volumes.set_up([VolumePlan("d", "hostPath", str(made), "DirectoryOrCreate")])
    assert made.is_dir() and "created" in note[0]
    new_file = tmp_path / "f"
    volumes.set_up([VolumePlan("f", "hostPath", str(new_file), "FileOrCreate")])
    assert new_file.is_file()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s.sock"))
        volumes.set_up([VolumePlan("s", "hostPath", str(tmp_path / "s.sock"), "Socket")])
    cases = [
        ("Directory", tmp_path / "absent", "does not exist"),
        ("Directory", new_file, "is not a directory"),
        ("File", made, "is not a file"),
        ("Socket", new_file, "is not a socket"),
        ("FileOrCreate", made, "is not a file"),
    ]
    for kind, path, reason in cases:
        with pytest.raises(volumes.VolumeSetupError, match=reason) as info:
            volumes.set_up([VolumePlan("v", "hostPath", str(path), kind)])
        assert str(path) in str(info.value) and "'v'" in str(info.value)


def test_host_path_refused_before_anything_is_created(tmp_path: Path) -> None:
    config = _config_volume(tmp_path / "cm", {"a": b"1"})
    with pytest.raises(volumes.VolumeSetupError):
        volumes.set_up([config, VolumePlan("v", "hostPath", str(tmp_path / "absent"), "Directory")])
    assert not (tmp_path / "cm").exists()


def test_memory_empty_dir_is_a_sized_tmpfs_and_tear_down_removes_it(tmp_path: Path) -> None:
    pod_dir = tmp_path / "pods" / "uid"
    path = pod_dir / "volumes" / "kubernetes.io~empty-dir" / "tmp"
    volumes.set_up([VolumePlan("tmp", "emptyDir", str(path), memory=True, size_limit=4 << 20)])
    try:
        fs = subprocess.run(["stat", "-f", "-c", "%T %b %S", str(path)], capture_output=True, text=True, check=True)
        kind, blocks, size = fs.stdout.split()
        assert kind == "tmpfs" and int(blocks) * int(size) == 4 << 20
        assert stat.S_IMODE(path.stat().st_mode) == 0o777
    finally:
        notes = volumes.tear_down(str(pod_dir))
    assert notes == [f"unmounted {path}", f"removed {pod_dir}"]
    assert not pod_dir.exists()


# -- the command ----------------------------------------------------------------------------


def test_command_dry_run_of_a_daemonset_with_configmap_file(tmp_path: Path) -> None:
    (tmp_path / "ds.yaml").write_text(DAEMONSET)
    (tmp_path / "maps.yaml").write_text(POLICY_MAP)
    args = [str(tmp_path / "ds.yaml"), "--configmap", str(tmp_path / "maps.yaml"), "--node-name", "node-1",
            "--node-ip", "10.0.0.7", "--kubelet-root", str(tmp_path / "k"), "--dry-run", "-o", "json"]
    result = CliRunner().invoke(play_command, args)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["pod"]["name"].startswith("hooks-")
    mounts = body["create_container"][0]["config"]["mounts"]
    assert mounts[0]["host_path"].startswith(str(tmp_path / "k" / "pods"))
    assert not (tmp_path / "k").exists()  # a dry run creates nothing


def test_command_missing_configmap_exits_2(tmp_path: Path) -> None:
    (tmp_path / "ds.yaml").write_text(DAEMONSET)
    result = CliRunner().invoke(play_command, [str(tmp_path / "ds.yaml"), "--node-ip", "1.2.3.4", "--dry-run"])
    assert result.exit_code == 2
    assert "configmap 'policy' not found" in result.stderr and "--configmap" in result.stderr
    assert "Traceback" not in result.output


def test_configmap_namespace_must_match() -> None:
    other = POLICY_MAP.replace("namespace: infra", "namespace: elsewhere")
    loaded = parse_input_text(DAEMONSET + "---\n" + other, "in.yaml", node_name="n")
    assert loaded.config_maps == {}
    assert isinstance(parse_input_text(INPUT, "x", node_name="n").config_maps["policy"], ConfigMap)
