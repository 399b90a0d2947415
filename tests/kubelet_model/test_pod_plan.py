"""What ``runtime-proxy play`` computes as kubelet, and how it drives CRI (with a fake)."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.kubelet_model import pod_plan
from runtimeproxy.kubelet_model.cri_resources import (
    container_oom_score_adj,
    linux_resources,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    oom_score_adj_for_request,
    read_machine_memory,
)
from runtimeproxy.kubelet_model.kube_qos import KubeQoSClass, pod_qos_class
from runtimeproxy.kubelet_model.manifest import load_pod, parse_pod
from runtimeproxy.kubelet_model.pod_plan import build_plan, expand_vars, pod_cgroup_parent
from runtimeproxy.kubelet_model.pod_resources import pod_limits, pod_requests
from runtimeproxy.play.runner import PlayError, delete, play

PODS = Path(__file__).parents[1] / "data" / "pods"
GI = 1024**3
UID = "11111111-2222-4333-8444-555555555555"


def make_pod(
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> Any:
    """A V1Pod from container resource dicts ({"requests": {...}, "limits": {...}})."""

    def container(index: int, body: dict[str, Any], prefix: str) -> dict[str, Any]:
        body = copy.deepcopy(body)
        extra = {k: body.pop(k) for k in list(body) if k not in ("requests", "limits")}
        return {
            "name": f"{prefix}{index}",
            "image": "localhost/runtimeproxy-testbed/busybox:1",
            "resources": body,
            **extra,
        }

    data: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": UID},
        "spec": {
            "containers": [container(i, c, "c") for i, c in enumerate(containers or [{}])],
            **spec,
        },
    }
    if init:
        data["spec"]["initContainers"] = [container(i, c, "i") for i, c in enumerate(init)]
    return parse_pod(data, "test")


def guaranteed(cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


# -- QoS class --------------------------------------------------------------------------------

QOS_CASES: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, KubeQoSClass]] = [
    ("nothing set", [{}], None, KubeQoSClass.BEST_EFFORT),
    ("two empty containers", [{}, {}], None, KubeQoSClass.BEST_EFFORT),
    ("only ephemeral-storage", [{"limits": {"ephemeral-storage": "1Gi"}}], None, KubeQoSClass.BEST_EFFORT),
    ("zero requests", [{"requests": {"cpu": "0", "memory": "0"}}], None, KubeQoSClass.BEST_EFFORT),
    ("requests equal limits", [guaranteed()], None, KubeQoSClass.GUARANTEED),
    (
        "limits only: requests default to limits",
        [{"limits": {"cpu": "500m", "memory": "256Mi"}}],
        None,
        KubeQoSClass.GUARANTEED,
    ),
    (
        "same value, different spelling",
        [{"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
        None,
        KubeQoSClass.GUARANTEED,
    ),
    ("two guaranteed containers", [guaranteed(), guaranteed("250m", "64Mi")], None, KubeQoSClass.GUARANTEED),
    ("memory request only", [{"requests": {"memory": "256Mi"}}], None, KubeQoSClass.BURSTABLE),
    ("cpu limit only", [{"limits": {"cpu": "1"}}], None, KubeQoSClass.BURSTABLE),
    (
        "requests below limits",
        [{"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
        None,
        KubeQoSClass.BURSTABLE,
    ),
    ("guaranteed + besteffort container", [guaranteed(), {}], None, KubeQoSClass.BURSTABLE),
    ("guaranteed with besteffort init container", [guaranteed()], [{}], KubeQoSClass.BURSTABLE),
    ("guaranteed with guaranteed init container", [guaranteed()], [guaranteed("2", "2Gi")], KubeQoSClass.GUARANTEED),
    ("besteffort with burstable init container", [{}], [{"requests": {"cpu": "100m"}}], KubeQoSClass.BURSTABLE),
    (
        "cpu and memory limits but cpu request lower",
        [{"requests": {"cpu": "100m"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
        None,
        KubeQoSClass.BURSTABLE,
    ),
]


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [case[1:] for case in QOS_CASES],
    ids=[case[0] for case in QOS_CASES],
)
def test_qos_class(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None, expected: KubeQoSClass) -> None:
    assert pod_qos_class(make_pod(containers, init)) is expected


def test_qos_pod_level_resources_win() -> None:
    pod = make_pod([{}], resources={"limits": {"cpu": "1", "memory": "1Gi"}})
    assert pod_qos_class(pod) is KubeQoSClass.GUARANTEED
    pod = make_pod([guaranteed()], resources={"requests": {"cpu": "1"}})
    assert pod_qos_class(pod) is KubeQoSClass.BURSTABLE


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ls-pod", KubeQoSClass.BURSTABLE),
        ("be-pod", KubeQoSClass.BEST_EFFORT),
        ("guaranteed-pod", KubeQoSClass.GUARANTEED),
    ],
)
def test_example_pods_qos(name: str, expected: KubeQoSClass) -> None:
    assert pod_qos_class(load_pod(PODS / f"{name}.yaml")) is expected


# -- cgroup parent ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qos", "expected"),
    [
        (KubeQoSClass.GUARANTEED, f"/kubepods/pod{UID}"),
        (KubeQoSClass.BURSTABLE, f"/kubepods/burstable/pod{UID}"),
        (KubeQoSClass.BEST_EFFORT, f"/kubepods/besteffort/pod{UID}"),
    ],
)
def test_cgroup_parent_cgroupfs(qos: KubeQoSClass, expected: str) -> None:
    assert pod_cgroup_parent(qos, UID) == expected


def test_cgroup_parent_with_cgroup_root() -> None:
    assert pod_cgroup_parent(KubeQoSClass.BURSTABLE, "u", cgroup_root="/test-1") == ("/test-1/kubepods/burstable/podu")
    assert pod_cgroup_parent(KubeQoSClass.GUARANTEED, "u", cgroup_root="/") == "/kubepods/podu"


def test_cgroup_parent_systemd() -> None:
    assert pod_cgroup_parent(KubeQoSClass.BURSTABLE, "12-ab", "systemd") == (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice"
    )
    assert pod_cgroup_parent(KubeQoSClass.GUARANTEED, "12-ab", "systemd") == ("/kubepods.slice/kubepods-pod12_ab.slice")


def test_cgroup_parent_unknown_driver() -> None:
    with pytest.raises(ValueError, match="cgroup driver"):
        pod_cgroup_parent(KubeQoSClass.BURSTABLE, "u", "nope")  # type: ignore[arg-type]


# -- CPU shares and quota -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "shares"),
    [
        (0, 2),
        (1, 2),
        (2, 2),
        (3, 3),
        (100, 102),
        (250, 256),
        (1000, 1024),
        (1500, 1536),
        (256000, 262144),
        (10**9, 262144),
    ],
)
def test_shares(milli: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(
    ("milli", "quota"),
    [(0, 0), (1, 1000), (9, 1000), (10, 1000), (11, 1100), (100, 10000), (500, 50000), (1000, 100000), (2500, 250000)],
)
def test_quota(milli: int, quota: int) -> None:
    assert milli_cpu_to_quota(milli) == quota


@given(st.integers(min_value=0, max_value=10**12))
def test_shares_always_in_kernel_range(milli: int) -> None:
    assert 2 <= milli_cpu_to_shares(milli) <= 262144


@given(st.integers(min_value=0, max_value=10**12))
def test_shares_monotonic(milli: int) -> None:
    assert milli_cpu_to_shares(milli) <= milli_cpu_to_shares(milli + 1)


@given(st.integers(min_value=0, max_value=10**12))
def test_quota_is_zero_or_at_least_1ms(milli: int) -> None:
    quota = milli_cpu_to_quota(milli)
    assert quota == 0 if milli == 0 else quota >= 1000


@given(st.integers(min_value=10, max_value=10**9))
def test_quota_matches_limit(milli: int) -> None:
    assert milli_cpu_to_quota(milli) == milli * 100


def test_linux_resources_request_defaults_to_limit() -> None:
    res = linux_resources(None, Decimal("0.5"), Decimal(GI))
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period) == (512, 50000, 100000)
    assert res.memory_limit_in_bytes == GI


def test_linux_resources_nothing_set() -> None:
    res = linux_resources(None, None, None)
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period, res.memory_limit_in_bytes) == (2, 0, 100000, 0)


def test_linux_resources_without_cfs_quota() -> None:
    res = linux_resources(Decimal(1), Decimal(2), None, cpu_cfs_quota=False)
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period) == (1024, 0, 0)


def test_milli_values_round_up() -> None:
    # resource.Quantity.MilliValue rounds up: 0.1m is 1 milliCPU.
    assert linux_resources(Decimal("0.0001"), None, None).cpu_shares == 2
    assert linux_resources(None, Decimal("0.0001"), None).cpu_quota == 1000
    assert linux_resources(None, None, Decimal("0.5")).memory_limit_in_bytes == 1


# -- OOM score ---------------------------------------------------------------------------------------


def test_oom_guaranteed_and_besteffort() -> None:
    pod = make_pod([guaranteed()])
    assert container_oom_score_adj(pod, pod.spec.containers[0], 8 * GI) == -997
    pod = make_pod([{}])
    assert container_oom_score_adj(pod, pod.spec.containers[0], 8 * GI) == 1000


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [(0, 999), (GI // 10, 988), (GI // 2, 938), (4 * GI, 500), (8 * GI, 3), (16 * GI, 3), (1, 999)],
)
def test_oom_burstable(request_bytes: int, expected: int) -> None:
    assert oom_score_adj_for_request(request_bytes, 8 * GI) == expected


def test_oom_burstable_container() -> None:
    pod = make_pod([{"requests": {"memory": "2Gi"}}, {"requests": {"cpu": "1"}}])
    first, second = pod.spec.containers
    assert container_oom_score_adj(pod, first, 8 * GI) == 750
    assert container_oom_score_adj(pod, second, 8 * GI) == 999


def test_oom_sidecar_not_above_smallest_regular_container() -> None:
    pod = make_pod(
        [{"requests": {"memory": "4Gi"}}],
        init=[{"requests": {"memory": "1Gi"}, "restartPolicy": "Always"}],
    )
    sidecar = pod.spec.init_containers[0]
    assert container_oom_score_adj(pod, sidecar, 8 * GI) == 500


def test_oom_node_critical_pod() -> None:
    pod = make_pod([{}], priorityClassName="system-node-critical")
    assert container_oom_score_adj(pod, pod.spec.containers[0], 8 * GI) == -997


@given(
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=1, max_value=2**40),
)
def test_oom_burstable_range(request_bytes: int, machine: int) -> None:
    assert 3 <= oom_score_adj_for_request(request_bytes, machine) <= 999


@given(st.integers(min_value=1, max_value=2**40))
def test_oom_besteffort_always_1000(machine: int) -> None:
    pod = make_pod([{}, {}])
    for container in pod.spec.containers:
        assert container_oom_score_adj(pod, container, machine) == 1000


def test_read_machine_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:  10 kB\nMemTotal:       24684084 kB\n")
    assert read_machine_memory(str(meminfo)) == 24684084 * 1024
    meminfo.write_text("MemFree: 1 kB\n")
    with pytest.raises(ValueError, match="MemTotal"):
        read_machine_memory(str(meminfo))


# -- pod-level sums --------------------------------------------------------------------------------------


def test_pod_requests_and_limits_sum_containers() -> None:
    pod = make_pod(
        [
            {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m"}},
            {"limits": {"cpu": "1", "memory": "1Gi"}},
        ]
    )
    assert pod_requests(pod) == {"cpu": Decimal("1.25"), "memory": Decimal(64 * 1024**2 + GI)}
    assert pod_limits(pod) == {"cpu": Decimal("1.5"), "memory": Decimal(GI)}


def test_pod_requests_with_init_containers() -> None:
    # A plain init container runs alone: the pod needs the larger of it and the sum.
    pod = make_pod([{"requests": {"cpu": "1"}}], init=[{"requests": {"cpu": "3"}}])
    assert pod_requests(pod)["cpu"] == Decimal(3)
    # A sidecar runs alongside: it adds up.
    pod = make_pod(
        [{"requests": {"cpu": "1"}}],
        init=[{"requests": {"cpu": "500m"}, "restartPolicy": "Always"}, {"requests": {"cpu": "1"}}],
    )
    assert pod_requests(pod)["cpu"] == Decimal("1.5")


def test_sandbox_resources_in_plan() -> None:
    pod = make_pod(
        [
            {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
            {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        ],
        overhead={"cpu": "100m", "memory": "10Mi"},
    )
    plan = build_plan(pod, log_dir_base="/logs", machine_memory=8 * GI)
    resources = plan.sandbox_config.linux.resources
    assert (resources.cpu_shares, resources.cpu_quota, resources.memory_limit_in_bytes) == (512, 100000, 256 * 1024**2)
    overhead = plan.sandbox_config.linux.overhead
    assert (overhead.cpu_shares, overhead.cpu_quota, overhead.memory_limit_in_bytes) == (102, 10000, 10 * 1024**2)


# -- env expansion --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("$(A)", "1"),
        ("x=$(A)=y", "x=1=y"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$", "$"),
        ("a$b", "a$b"),
        ("$(A", "$(A"),
        ("$(A)$(B)", "12"),
        ("$()", "$()"),
    ],
)
def test_expand_vars(text: str, expected: str) -> None:
    assert expand_vars(text, {"A": "1", "B": "2"}.get) == expected


# -- the plan ----------------------------------------------------------------------------------------------


def _ls_plan(tmp_path: Path) -> pod_plan.PodPlan:
    return build_plan(load_pod(PODS / "ls-pod.yaml"), log_dir_base=str(tmp_path), machine_memory=8 * GI)


def test_plan_sandbox_request(tmp_path: Path) -> None:
    plan = _ls_plan(tmp_path)
    config = plan.sandbox_config
    uid = plan.uid
    assert config.metadata.name == "ls-pod"
    assert config.metadata.namespace == "default"
    assert config.metadata.uid == uid
    assert config.labels["io.kubernetes.pod.name"] == "ls-pod"
    assert config.labels["io.kubernetes.pod.namespace"] == "default"
    assert config.labels["io.kubernetes.pod.uid"] == uid
    assert config.labels["koordinator.sh/qosClass"] == "LS"
    assert config.annotations["runtimeproxy.test/purpose"] == "latency-sensitive example"
    assert config.log_directory == str(tmp_path / f"default_ls-pod_{uid}")
    assert config.hostname == ""  # host network: the node's hostname
    linux = config.linux
    assert linux.cgroup_parent == f"/kubepods/burstable/pod{uid}"
    assert linux.security_context.namespace_options.network == cri.NODE
    assert linux.security_context.namespace_options.pid == cri.CONTAINER
    assert linux.security_context.namespace_options.ipc == cri.POD


def test_plan_container_request(tmp_path: Path) -> None:
    plan = _ls_plan(tmp_path)
    (app,) = plan.containers
    assert app.kind == "container"
    assert app.request.pod_sandbox_id == ""
    assert app.request.sandbox_config == plan.sandbox_config
    config = app.config
    assert config.metadata.name == "app"
    assert config.image.image == "localhost/runtimeproxy-testbed/busybox:1"
    assert config.command[-1] == "echo started hello=world; exec sleep 3600"
    env = {kv.key: kv.value for kv in config.envs}
    assert env["GREETING"] in ("hello=world", b"hello=world")
    assert config.labels == {
        "io.kubernetes.pod.name": "ls-pod",
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.pod.uid": plan.uid,
        "io.kubernetes.container.name": "app",
    }
    assert config.annotations["io.kubernetes.container.restartCount"] == "0"
    assert config.annotations["io.kubernetes.pod.terminationGracePeriod"] == "1"
    assert config.log_path == "app/0.log"
    resources = config.linux.resources
    assert (resources.cpu_shares, resources.cpu_quota, resources.cpu_period) == (256, 50000, 100000)
    assert resources.memory_limit_in_bytes == 128 * 1024**2
    assert resources.oom_score_adj == 1000 - (1000 * 64 * 1024**2) // (8 * GI)
    security = config.linux.security_context
    assert security.namespace_options.network == cri.NODE
    assert "/proc/kcore" in security.masked_paths


def test_plan_for_sandbox_fills_id_and_image_ref(tmp_path: Path) -> None:
    plan = _ls_plan(tmp_path)
    request = plan.containers[0].for_sandbox("sb-1", "sha256:abc")
    assert request.pod_sandbox_id == "sb-1"
    assert request.config.image.image == "sha256:abc"
    assert request.config.image.user_specified_image == "localhost/runtimeproxy-testbed/busybox:1"
    assert plan.containers[0].request.pod_sandbox_id == ""  # the template is untouched


def test_plan_guaranteed_and_besteffort(tmp_path: Path) -> None:
    plan = build_plan(load_pod(PODS / "guaranteed-pod.yaml"), log_dir_base=str(tmp_path), machine_memory=8 * GI)
    assert plan.cgroup_parent == f"/kubepods/pod{plan.uid}"
    helper = plan.container("helper").config.linux.resources
    assert (helper.cpu_shares, helper.cpu_quota, helper.oom_score_adj) == (102, 10000, -997)
    plan = build_plan(load_pod(PODS / "be-pod.yaml"), log_dir_base=str(tmp_path), machine_memory=8 * GI)
    assert plan.cgroup_parent == f"/kubepods/besteffort/pod{plan.uid}"
    app = plan.container("app").config.linux.resources
    assert (app.cpu_shares, app.cpu_quota, app.memory_limit_in_bytes, app.oom_score_adj) == (2, 0, 0, 1000)


def test_plan_pod_network_hostname_and_namespaces() -> None:
    pod = make_pod([{}], hostPID=True, hostIPC=True, hostname="box")
    plan = build_plan(pod, log_dir_base="/l", machine_memory=GI)
    config = plan.sandbox_config
    assert config.hostname == "box"
    options = config.linux.security_context.namespace_options
    assert (options.network, options.pid, options.ipc) == (cri.POD, cri.NODE, cri.NODE)
    shared = build_plan(make_pod([{}], shareProcessNamespace=True), log_dir_base="/l", machine_memory=GI)
    assert shared.sandbox_config.linux.security_context.namespace_options.pid == cri.POD
    assert shared.sandbox_config.hostname == "p"


def test_plan_security_context() -> None:
    pod = make_pod(
        [
            {
                "securityContext": {
                    "privileged": True,
                    "runAsUser": 1000,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"add": ["NET_ADMIN"]},
                }
            },
            {},
        ],
        securityContext={
            "runAsUser": 7,
            "runAsGroup": 8,
            "fsGroup": 9,
            "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}],
        },
    )
    plan = build_plan(pod, log_dir_base="/l", machine_memory=GI)
    sandbox = plan.sandbox_config.linux
    assert sandbox.security_context.privileged is True
    assert sandbox.security_context.run_as_user.value == 7
    assert list(sandbox.security_context.supplemental_groups) == [9]
    assert dict(sandbox.sysctls) == {"net.core.somaxconn": "1024"}
    first = plan.containers[0].config.linux.security_context
    assert first.privileged and first.no_new_privs
    assert first.run_as_user.value == 1000
    assert first.run_as_group.value == 8
    assert list(first.capabilities.add_capabilities) == ["NET_ADMIN"]
    second = plan.containers[1].config.linux.security_context
    assert not second.privileged
    assert second.run_as_user.value == 7


def test_plan_init_containers_come_first() -> None:
    pod = make_pod([{}], init=[{}, {"restartPolicy": "Always"}])
    plan = build_plan(pod, log_dir_base="/l", machine_memory=GI)
    assert [(c.name, c.kind) for c in plan.containers] == [("i0", "init"), ("i1", "sidecar"), ("c0", "container")]
    assert plan.containers[0].config.annotations["io.kubernetes.container.type"] == "init"


def test_plan_reads_meminfo_when_not_given(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1048576 kB\n")
    pod = make_pod([{"requests": {"memory": "512Mi"}}])
    plan = build_plan(pod, log_dir_base="/l", meminfo_path=str(meminfo))
    assert plan.machine_memory == GI
    assert plan.containers[0].config.linux.resources.oom_score_adj == 500


# -- the runner, against a fake CRI -------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # grpc.Call's other abstract methods, unused here.
    def initial_metadata(self) -> Any: ...
    def trailing_metadata(self) -> Any: ...
    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> Any: ...
    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class FakeService:
    def __init__(self, owner: FakeCri) -> None:
        self.owner = owner

    def __getattr__(self, method: str) -> Any:
        def call(request: Any, timeout: float | None = None) -> Any:
            self.owner.calls.append((method, request))
            failure = self.owner.fail.get(method)
            if failure is not None:
                raise FakeRpcError(*failure)
            return self.owner.answer(method, request)

        return call


class FakeCri:
    timeout = 5.0

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.images = {"localhost/runtimeproxy-testbed/busybox:1": "sha256:busybox"}
        self.created = 0
        self.runtime = FakeService(self)
        self.image = FakeService(self)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def answer(self, method: str, request: Any) -> Any:
        if method == "ImageStatus":
            ref = self.images.get(request.image.image)
            if ref is None:
                return cri.ImageStatusResponse()
            return cri.ImageStatusResponse(image=cri.Image(id=ref))
        if method == "PullImage":
            self.images[request.image.image] = "sha256:pulled"
            return cri.PullImageResponse(image_ref="sha256:pulled")
        if method == "RunPodSandbox":
            return cri.RunPodSandboxResponse(pod_sandbox_id="sb-1")
        if method == "CreateContainer":
            self.created += 1
            return cri.CreateContainerResponse(container_id=f"ctr-{self.created}")
        if method == "ContainerStatus":
            return cri.ContainerStatusResponse(status=cri.ContainerStatus(state=cri.CONTAINER_EXITED, exit_code=0))
        if method == "ListPodSandbox":
            return cri.ListPodSandboxResponse(items=[cri.PodSandbox(id="sb-1")])
        if method == "ListContainers":
            return cri.ListContainersResponse(
                containers=[cri.Container(id="ctr-1", metadata=cri.ContainerMetadata(name="app"))]
            )
        return None


def _guaranteed_plan(tmp_path: Path) -> pod_plan.PodPlan:
    return build_plan(load_pod(PODS / "guaranteed-pod.yaml"), log_dir_base=str(tmp_path), machine_memory=8 * GI)


def test_play_sends_kubelet_sequence(tmp_path: Path) -> None:
    fake = FakeCri()
    plan = _guaranteed_plan(tmp_path)
    lines: list[str] = []
    result = play(plan, fake, say=lines.append)  # type: ignore[arg-type]
    assert fake.names() == [
        "ImageStatus",
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "CreateContainer",
        "StartContainer",
    ]
    assert result.pod_sandbox_id == "sb-1"
    assert [c.container_id for c in result.containers] == ["ctr-1", "ctr-2"]
    create = fake.calls[2][1]
    assert create.pod_sandbox_id == "sb-1"
    assert create.config.image.image == "sha256:busybox"
    assert (tmp_path / f"default_guaranteed-pod_{plan.uid}" / "app").is_dir()
    assert any("sb-1" in line for line in lines)
    assert result.to_dict()["containers"][1]["name"] == "helper"


def test_play_missing_image_without_pull(tmp_path: Path) -> None:
    fake = FakeCri()
    fake.images.clear()
    with pytest.raises(PlayError) as info:
        play(_guaranteed_plan(tmp_path), fake)  # type: ignore[arg-type]
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert "--pull" in str(info.value)
    assert fake.names() == ["ImageStatus"]


def test_play_pulls_when_asked(tmp_path: Path) -> None:
    fake = FakeCri()
    fake.images.clear()
    play(_guaranteed_plan(tmp_path), fake, pull=True)  # type: ignore[arg-type]
    assert fake.names()[:3] == ["ImageStatus", "PullImage", "RunPodSandbox"]
    assert fake.calls[3][1].config.image.image == "sha256:pulled"


def test_play_failure_midway_rolls_back(tmp_path: Path) -> None:
    fake = FakeCri()
    fake.fail["StartContainer"] = (grpc.StatusCode.INTERNAL, "runc exploded")
    with pytest.raises(PlayError) as info:
        play(_guaranteed_plan(tmp_path), fake)  # type: ignore[arg-type]
    error = info.value
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.details == "runc exploded"
    assert str(error) == "StartContainer app failed: INTERNAL: runc exploded"
    assert fake.names() == [
        "ImageStatus",
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ]
    assert error.cleanup[-1] == "RemovePodSandbox sb-1"
    assert error.to_dict()["code"] == "INTERNAL"


def test_play_init_container_failure_rolls_back(tmp_path: Path) -> None:
    fake = FakeCri()
    original = fake.answer

    def answer(method: str, request: Any) -> Any:
        if method == "ContainerStatus":
            return cri.ContainerStatusResponse(
                status=cri.ContainerStatus(state=cri.CONTAINER_EXITED, exit_code=3, reason="Error")
            )
        return original(method, request)

    fake.answer = answer  # type: ignore[method-assign]
    pod = make_pod([{}], init=[{}])
    plan = build_plan(pod, log_dir_base=str(tmp_path), machine_memory=GI)
    with pytest.raises(PlayError, match="exited with code 3"):
        play(plan, fake)  # type: ignore[arg-type]
    assert "RemovePodSandbox" in fake.names()
    assert fake.names().count("CreateContainer") == 1


def test_delete_by_uid_label(tmp_path: Path) -> None:
    fake = FakeCri()
    plan = _guaranteed_plan(tmp_path)
    result = delete(plan, fake)  # type: ignore[arg-type]
    assert fake.names() == [
        "ListPodSandbox",
        "ListContainers",
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ]
    listing = fake.calls[0][1]
    assert dict(listing.filter.label_selector) == {"io.kubernetes.pod.uid": plan.uid}
    assert fake.calls[2][1].timeout == 1  # the pod's terminationGracePeriodSeconds
    assert result.pod_sandbox_ids == ["sb-1"]
    assert result.container_ids == ["ctr-1"]


def test_delete_nothing_found(tmp_path: Path) -> None:
    fake = FakeCri()
    fake.answer = lambda method, request: cri.ListPodSandboxResponse()  # type: ignore[method-assign]
    result = delete("some-uid", fake)  # type: ignore[arg-type]
    assert result.pod_sandbox_ids == []
    assert fake.names() == ["ListPodSandbox"]


def test_delete_grpc_error(tmp_path: Path) -> None:
    fake = FakeCri()
    fake.fail["ListPodSandbox"] = (grpc.StatusCode.UNAVAILABLE, "down")
    with pytest.raises(PlayError, match="ListPodSandbox failed: UNAVAILABLE: down"):
        delete("uid", fake)  # type: ignore[arg-type]


def _volume_plan(tmp_path: Path) -> pod_plan.PodPlan:
    from runtimeproxy.kubelet_model.manifest import ConfigMap

    pod = make_pod(
        [{"volumeMounts": [{"name": "config", "mountPath": "/etc/c"}, {"name": "scratch", "mountPath": "/s"}]}],
        volumes=[{"name": "config", "configMap": {"name": "c"}}, {"name": "scratch", "emptyDir": {}}],
    )
    maps = {"c": ConfigMap(name="c", namespace="ns", files={"k": b"v"})}
    return build_plan(pod, log_dir_base=str(tmp_path / "logs"), machine_memory=8 * GI,
                      kubelet_root=str(tmp_path / "kubelet"), node=pod_plan.NodeFacts(config_maps=maps))


def test_play_sets_up_volumes_and_delete_removes_them(tmp_path: Path) -> None:
    plan = _volume_plan(tmp_path)
    fake = FakeCri()
    play(plan, fake)  # type: ignore[arg-type]
    pod_dir = Path(plan.pod_directory)
    assert (pod_dir / "volumes/kubernetes.io~configmap/config/k").read_bytes() == b"v"
    assert (pod_dir / "volumes/kubernetes.io~empty-dir/scratch").is_dir()
    delete(plan, fake)  # type: ignore[arg-type]
    assert not pod_dir.exists()


def test_failed_sandbox_removes_the_volumes_it_made_but_not_a_running_pods(tmp_path: Path) -> None:
    plan = _volume_plan(tmp_path)
    fake = FakeCri()
    fake.fail["RunPodSandbox"] = (grpc.StatusCode.UNKNOWN, "no")
    with pytest.raises(PlayError) as info:
        play(plan, fake)  # type: ignore[arg-type]
    pod_dir = Path(plan.pod_directory)
    assert not pod_dir.exists() and f"removed {pod_dir}" in info.value.cleanup
    pod_dir.mkdir(parents=True)  # the same pod already running (its sandbox name is taken): volumes stay
    with pytest.raises(PlayError):
        play(plan, fake)  # type: ignore[arg-type]
    assert (pod_dir / "volumes/kubernetes.io~configmap/config/..data").is_symlink()


def test_unsafe_host_path_type_fails_before_the_sandbox(tmp_path: Path) -> None:
    pod = make_pod([{"volumeMounts": [{"name": "h", "mountPath": "/h"}]}],
                   volumes=[{"name": "h", "hostPath": {"path": str(tmp_path / "absent"), "type": "Directory"}}])
    plan = build_plan(pod, log_dir_base=str(tmp_path / "logs"), machine_memory=8 * GI)
    fake = FakeCri()
    with pytest.raises(PlayError, match="does not exist") as info:
        play(plan, fake)  # type: ignore[arg-type]
    assert info.value.step == "volumes" and "RunPodSandbox" not in fake.names()
