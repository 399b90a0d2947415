"""On a systemd-driver node, the pod-slice values runtime-hooks sets must survive
systemd re-applying its unit properties: when runc starts the sandbox's scope, when a sibling
pod goes, and on `systemctl daemon-reload`.

The guest samples each pod slice's files every 100 ms (changes only, with the guest's
uptime) while a pod starts and for a while after, and while a sibling is deleted and its
slice stopped. Values with a systemd property (cpu.max, memory.min/low/high) must hold at
every sample from the moment the hook set them; cpu.idle, which systemd has no property
for, is re-applied by runtime-hooks when systemd resets it, within REAPPLY_S.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Evidence, show
from .plan import PODS, SIBLING_REMOVAL
from .test_node import EXPECTED_POD

pytestmark = pytest.mark.e2e

Samples = list[list[Any]]  # [uptime, value] pairs, one per change
# Values with a systemd unit property: set through systemd, so systemd itself keeps them.
HELD = {"be": ("cpu.max",), "ls": ("memory.min", "memory.low", "memory.high")}
# How fast a value with no systemd property comes back after systemd reset it.
REAPPLY_S = 2.0


def _from_first(samples: Samples, want: str) -> Samples:
    """The samples from the first one showing `want` on."""
    start = next((i for i, (_, value) in enumerate(samples) if value == want), None)
    assert start is not None, f"never reached {want!r}: {show(samples)}"
    return samples[start:]


def _deviations(samples: Samples, want: str) -> Samples:
    return [sample for sample in samples if sample[1] != want]


@pytest.mark.parametrize(("pod", "name"), [(pod, name) for pod, names in HELD.items() for name in names])
def test_pod_value_holds_from_the_hook_on_while_the_pod_starts(fact: Evidence, pod: str, name: str) -> None:
    played = fact(f"pod/{pod}")
    want = EXPECTED_POD[pod][name]
    after = _from_first(played["samples"][name], want)
    assert not _deviations(after, want), f"{pod} {name} left {want!r}: {show(after)}\n{show(played['journal_hooks'])}"
    assert next(p for p in PODS if p.name == pod).observe_s >= 5  # sampled for 5 s after the start at least


@pytest.mark.parametrize(("pod", "name"), [(pod, name) for pod, names in HELD.items() for name in names])
def test_pod_value_holds_while_a_sibling_is_removed(fact: Evidence, pod: str, name: str) -> None:
    sibling = fact("sibling-removal")
    assert sibling["deleted"]["ok"], show(sibling["deleted"])
    samples = sibling["samples"][pod][name]
    want = EXPECTED_POD[pod][name]
    assert samples and not _deviations(samples, want), f"{pod} {name}: {show(samples)}"


@pytest.mark.parametrize(("pod", "name"), [(pod, name) for pod, names in HELD.items() for name in names])
def test_pod_value_holds_right_after_daemon_reload(fact: Evidence, pod: str, name: str) -> None:
    settle = fact("settle")
    assert settle["daemon_reload"]["rc"] == 0, show(settle["daemon_reload"])
    files = settle["after_daemon_reload"][pod]
    assert files.get(name) == EXPECTED_POD[pod][name], show(files)


def _resets_repaired(samples: Samples, want: str) -> list[tuple[float, float | None]]:
    """Each stretch away from `want`: (when it began, how long until `want` was back)."""
    stretches: list[tuple[float, float | None]] = []
    began: float | None = None
    for when, value in samples:
        if value != want and began is None:
            began = when
        elif value == want and began is not None:
            stretches.append((began, round(when - began, 2)))
            began = None
    if began is not None:
        stretches.append((began, None))
    return stretches


def test_be_cpu_idle_is_reapplied_when_systemd_resets_it(fact: Evidence) -> None:
    want = EXPECTED_POD["be"]["cpu.idle"]
    for samples in (fact("pod/be")["samples"]["cpu.idle"], fact("sibling-removal")["samples"]["be"]["cpu.idle"]):
        stretches = _resets_repaired(_from_first(samples, want), want)
        slow = [(began, took) for began, took in stretches if took is None or took > REAPPLY_S]
        assert not slow, f"cpu.idle away from {want} for too long (began, seconds): {show(stretches)}"


def test_no_pod_slice_left_after_the_pod_is_removed(fact: Evidence) -> None:
    sibling = fact("sibling-removal")
    assert sibling["stopped"]["rc"] == 0, show(sibling["stopped"])
    assert not sibling["cgroup_left"], show(sibling)
    assert sibling["slice"].get("ActiveState") != "active", show(sibling["slice"])
    gone = next(p for p in PODS if p.name == SIBLING_REMOVAL["pod"]).slice
    assert gone not in sibling["pod_slices"], f"{gone} still loaded: {show(sibling['pod_slices'])}"
