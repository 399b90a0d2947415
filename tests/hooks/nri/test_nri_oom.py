"""The OOM score in NRI mode (hooks/nri/oom.py) against a fake /proc: raised only, never lowered,
never written to a process outside the container's cgroup, and every other outcome a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.nri.oom import OomApplied, OomNotApplied, OomScores
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.plugin_runner import PluginRunner
from structlog.testing import capture_logs
from test_nri_mapping import call, nri_pod

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri

CID = "c0ffee" * 10
CGROUP = f"/kubepods/pod1/{CID}"  # the container's cgroups path, as the runtime gives it


def fake_process(proc: Path, pid: int, oom: str, cgroup: str = f"4:cpu,cpuacct:{CGROUP}\n") -> Path:
    directory = proc / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup").write_text(cgroup)
    (directory / "oom_score_adj").write_text(oom)
    return directory / "oom_score_adj"


def test_a_remembered_score_is_raised_once_and_only_then(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 42, "500\n")
    scores = OomScores(tmp_path)
    assert scores.remember(CID, 1000) == []
    assert scores.apply(CID, 42, CGROUP) == OomApplied(42, 500, 1000)
    assert oom_file.read_text() == "1000\n"
    assert scores.apply(CID, 42, CGROUP) is None  # applied once; nothing pending now
    assert scores.apply("other", 42, CGROUP) is None  # nothing remembered for it


def test_a_higher_score_is_never_lowered(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 42, "1000\n")
    scores = OomScores(tmp_path)
    scores.remember(CID, 900)
    applied = scores.apply(CID, 42, CGROUP)
    assert applied == OomApplied(42, 1000, 1000) and not applied.raised
    assert oom_file.read_text() == "1000\n"


@pytest.mark.parametrize(
    ("pid", "setup", "reason"),
    [
        (0, None, "the runtime gave no pid"),
        (7, None, "process 7 is gone"),
        (42, "0::/other/container\n", "process 42 is not in the cgroup of container"),
    ],
)
def test_what_cannot_be_applied_says_why(tmp_path: Path, pid: int, setup: str | None, reason: str) -> None:
    if setup is not None:
        oom_file = fake_process(tmp_path, pid, "0\n", cgroup=setup)
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    with pytest.raises(OomNotApplied, match=reason):
        scores.apply(CID, pid, CGROUP)
    if setup is not None:
        assert oom_file.read_text() == "0\n"  # a reused pid is never touched
    assert scores.apply(CID, pid, CGROUP) is None  # given up, not retried


HOST_SSHD = "12:pids:/system.slice/ssh.service\n4:cpu,cpuacct:/system.slice/ssh.service\n0::/system.slice/ssh.service\n"


@pytest.mark.parametrize(
    ("container_id", "cgroups_path", "cgroup"),
    [
        # a container id that is a controller's name: every process's file holds it
        ("cpu", "/kubepods/pod1/cpu", HOST_SSHD),
        ("cpu", "kubepods-pod1.slice:cri-containerd:cpu", HOST_SSHD),
        ("cpu", "", HOST_SSHD),
        ("pids", "", HOST_SSHD),
        # the id inside a longer name, a directory above the process's, another pod's same-named directory
        (CID, CGROUP, f"4:cpu,cpuacct:{CGROUP}0\n0::/x{CID}\n"),
        (CID, CGROUP, f"4:cpu,cpuacct:{CGROUP}/sub\n"),
        (CID, CGROUP, f"4:cpu,cpuacct:/kubepods/pod2/{CID}\n"),
        (CID, "", f"4:cpu,cpuacct:/kubepods/{CID}/sub\n"),
    ],
)
def test_a_process_outside_the_containers_cgroup_is_left_alone(
    tmp_path: Path, container_id: str, cgroups_path: str, cgroup: str
) -> None:
    oom_file = fake_process(tmp_path, 4242, "0\n", cgroup=cgroup)
    scores = OomScores(tmp_path)
    scores.remember(container_id, 1000)
    with pytest.raises(OomNotApplied, match=f"process 4242 is not in the cgroup of container {container_id} "):
        scores.apply(container_id, 4242, cgroups_path)
    assert oom_file.read_text() == "0\n"


@pytest.mark.parametrize(
    ("cgroups_path", "cgroup"),
    [
        (CGROUP, f"11:memory:{CGROUP}\n4:cpu,cpuacct:{CGROUP}\n1:name=systemd:/system.slice/containerd.service\n"),
        (CGROUP, f"0::/system.slice/containerd.service\n4:cpu,cpuacct:{CGROUP}\n"),  # hybrid: v1 holds it
        (
            f"kubepods-besteffort-pod1.slice:cri-containerd:{CID}",
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-{CID}.scope\n",
        ),
        (CID, f"0::/system.slice/containerd.service/{CID}\n"),  # relative: below the runtime's cgroup
        (CGROUP, f"0::/../../pod1/{CID}\n"),  # seen from inside a cgroup namespace
        ("", f"0::/kubepods.slice/cri-containerd-{CID}.scope\n"),
    ],
)
def test_the_containers_process_is_found_in_each_cgroup_layout(tmp_path: Path, cgroups_path: str, cgroup: str) -> None:
    oom_file = fake_process(tmp_path, 42, "0\n", cgroup=cgroup)
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    assert scores.apply(CID, 42, cgroups_path) == OomApplied(42, 0, 1000)
    assert oom_file.read_text() == "1000\n"


async def test_the_refusal_is_logged_naming_the_pid_and_the_container(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 4242, "0\n", cgroup=HOST_SSHD)
    hooks = NriHooks(PluginRunner([], registry=CollectorRegistry()), oom=OomScores(tmp_path))
    hooks.oom.remember("cpu", 1000)
    container = nri.Container(id="cpu", name="app", pid=4242)
    container.linux.cgroups_path = "/kubepods/pod1/cpu"
    started = nri.StateChangeEvent(event=nri.POST_START_CONTAINER, pod=nri_pod(), container=container)
    with capture_logs() as logs:
        await call(hooks, "StateChange", started)
        await hooks.queues.drain()
    [warning] = [entry for entry in logs if entry["event"] == "answer fields NRI cannot apply were not applied"]
    assert warning["container"] == "app" and warning["nri_event"] == "PostStartContainer"
    [field] = warning["fields"]
    assert field.startswith("resources.oom_score_adj: process 4242 is not in the cgroup of container cpu ")
    assert oom_file.read_text() == "0\n"


def test_a_cgroups_path_runc_would_refuse_is_a_reason(tmp_path: Path) -> None:
    fake_process(tmp_path, 42, "0\n")
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    with pytest.raises(OomNotApplied, match="not slice:prefix:name"):
        scores.apply(CID, 42, "a.slice:b")


def test_an_unwritable_file_is_a_reason(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 42, "0\n")
    oom_file.unlink()
    oom_file.mkdir()  # reading fails: EISDIR
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    with pytest.raises(OomNotApplied, match="/proc/42/oom_score_adj"):
        scores.apply(CID, 42, CGROUP)


def test_remember_refuses_what_the_kernel_would_and_forgets_stopped_containers(tmp_path: Path) -> None:
    scores = OomScores(tmp_path, limit=2)
    for bad in (1001, -1001):
        with pytest.raises(ValueError, match=r"outside -1000\.\.1000"):
            scores.remember(CID, bad)
    with pytest.raises(ValueError, match="no container id"):
        scores.remember("", 1000)
    scores.remember("a", 1000)
    assert scores.forget("a") == 1000 and scores.forget("a") is None
    assert scores.remember("a", 1) == [] and scores.remember("b", 2) == []
    assert scores.remember("c", 3) == ["a"]  # the oldest goes past the limit
    assert len(scores) == 2


@given(st.one_of(st.integers(-5000, 5000).map(str), st.text(max_size=12)))
def test_any_file_content_gives_a_value_or_a_reason(content: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        proc = Path(directory)
        fake_process(proc, 42, content)
        scores = OomScores(proc)
        scores.remember(CID, 1000)
        try:
            value = int(content.strip())
        except ValueError:
            value = None
        if value is not None and -1000 <= value <= 1000:
            applied = scores.apply(CID, 42, CGROUP)
            assert applied == OomApplied(42, value, 1000)
        else:
            with pytest.raises(OomNotApplied, match="oom_score_adj holds"):
                scores.apply(CID, 42, CGROUP)


def test_the_files_are_read_and_written_with_plain_system_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Python file object (each costs an fstat, an ioctl and lseeks more): raised, and refused
    outside the container's cgroup, as with them."""
    from runtimeproxy.hooks.nri import oom

    def no_file_objects(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Python file object was opened")

    monkeypatch.setattr(oom, "open", no_file_objects, raising=False)
    oom_file = fake_process(tmp_path, 42, "500\n")
    outside = fake_process(tmp_path, 43, "0\n", cgroup=f"4:cpu,cpuacct:/kubepods/pod2/{CID}\n")
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    assert scores.apply(CID, 42, CGROUP) == OomApplied(42, 500, 1000)
    assert oom_file.read_text() == "1000\n"
    scores.remember(CID, 1000)
    with pytest.raises(OomNotApplied, match=f"process 43 is not in the cgroup of container {CID} "):
        scores.apply(CID, 43, CGROUP)
    assert outside.read_text() == "0\n"
