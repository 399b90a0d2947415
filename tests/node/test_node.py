"""Checks of the real-node scenario: each test asserts one property of what the guest saw,
on each node flavour (conftest).

Expected cgroup values are worked out by hand from the pods (plan.py), the guest policy
and the plugins' documented formulas, not taken from the plugins' own code: a value that
differs is a finding. Values kubelet owns (the pod's cpu.weight and memory.max, the CFS
quota of LS pods) must be exactly what kubelet's slice was given. Weights differ by flavour:
runc 1.1 converts CPU shares to cpu.weight linearly, runc 1.3.2+ with a log-quadratic
formula; the weights runc writes, kubelet's and the plugins' all follow the node's runc.
"""

from __future__ import annotations

from typing import Any

import pytest
from runtimeproxy.hooks.cgroups import WeightConversion, shares_to_weight

from runtimeproxy.testbed.noderun import NodeRun

from .conftest import Evidence, show
from .plan import DRIFT, MIB, PODS, PROXY_SOCKET, RESTART_POD, Pod, kubelet_shares, kubelet_slice, slice_cgroup

pytestmark = pytest.mark.e2e

PAGE = 4096
UNLIMITED = "max 100000"

# What the plugins write, per pod (pod slice level and the container's scope), by hand:
# lsr         LSR, cfs_quota_enabled false: no CFS quota at pod and container level; pinned
#             to the cpuset of its resource-status annotation.
# ls          LS, burst 1000 % of the 50000 us quota, capped at the quota; memory.min 50 % of
#             the 64Mi request, memory.low 100 %, memory.high = request + 80 % of (128Mi - 64Mi).
# be          BE, batch-cpu limit 1000m: quota 100000 us at pod and container level, the
#             container's shares from the 500m batch request (512: weight 20 linear, 59
#             log-quadratic, see plugin_weights); cpu.idle 1.
# guaranteed  no Koordinator label: Guaranteed is LSR, but not pinned (no cpuset assigned), so
#             its CFS quota stays kubelet's: lifting it would let it run unbounded on the pool.
# burstable   LS: no cpu limit, so no burst; memory.high = 80 % of the 64Mi limit (no request
#             is known to the plugin: no annotation, no unified memory.min).
# besteffort  BE without batch resources: the quota stays kubelet's (none); cpu.idle 1.
_LS_HIGH = (64 * MIB + (128 - 64) * MIB * 80 // 100) // PAGE * PAGE
_BURSTABLE_HIGH = (64 * MIB * 80 // 100) // PAGE * PAGE
EXPECTED_POD: dict[str, dict[str, str]] = {
    "lsr": {"cpu.max": UNLIMITED, "cpu.max.burst": "0", "cpu.idle": "0"},
    "ls": {"cpu.max.burst": "50000", "cpu.idle": "0", "memory.min": str(32 * MIB), "memory.low": str(64 * MIB),
           "memory.high": str(_LS_HIGH)},
    "be": {"cpu.max": "100000 100000", "cpu.max.burst": "0", "cpu.idle": "1"},
    "guaranteed": {"cpu.max.burst": "0", "cpu.idle": "0"},
    "burstable": {"cpu.max.burst": "0", "cpu.idle": "0", "memory.high": str(_BURSTABLE_HIGH)},
    "besteffort": {"cpu.max": UNLIMITED, "cpu.idle": "1"},
}
EXPECTED_CONTAINER: dict[str, dict[str, str]] = {
    "lsr": {"cpu.max": UNLIMITED, "cpuset.cpus": "1", "cpuset.cpus.effective": "1"},
    "ls": {"cpu.max": "50000 100000", "cpu.max.burst": "50000", "memory.min": str(32 * MIB),
           "memory.low": str(64 * MIB), "memory.high": str(_LS_HIGH)},
    "be": {"cpu.max": "100000 100000"},
    "guaranteed": {"cpu.max": "50000 100000"},
    "burstable": {"cpu.max": UNLIMITED, "memory.high": str(_BURSTABLE_HIGH)},
    "besteffort": {"cpu.max": UNLIMITED},
}
POD_NAMES = [pod.name for pod in PODS]
# The kubelet stand-in's command line before install and after uninstall.
KUBELET_OWN_ENDPOINT = "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"
# What `runtime-proxy install` writes or makes (the rest of the paths the scenario checks come
# and go with the running units).
INSTALLED = ("/etc/systemd/system/runtime-proxy.service", "/etc/systemd/system/runtime-hooks.service",
             "/etc/default/runtime-proxy", "/etc/default/runtime-hooks", "/etc/runtime/hookserver.d",
             "/etc/systemd/system/kubelet.service.d/10-runtime-proxy.conf", "/var/lib/runtimeproxy/install.json",
             "/run/runtimeproxy", "/run/runtimehooks")
# The BE pod's weight is the cpu plugin's, as Koordinator's batchresource hook sets it: its
# batch-cpu requests (500m) as shares, in the pod slice (whose cpu.weight file reads 0 while
# cpu.idle is 1, so the slice property is where it shows) and the container's scope. Every
# other pod keeps kubelet's, and every other container runc's.
OUR_SHARES = {"be": 512}


def plugin_weights(conversion: WeightConversion) -> dict[str, str]:
    """The weights the cpu plugin writes, by pod, under the node runc's conversion."""
    return {name: str(shares_to_weight(shares, conversion)) for name, shares in OUR_SHARES.items()}


def runc_weights(conversion: WeightConversion) -> dict[str, str]:
    """What runc writes into each container's scope for kubelet's shares (pods whose weight
    the plugins leave alone)."""
    return {pod.name: str(shares_to_weight(kubelet_shares(pod), conversion)) for pod in PODS
            if pod.name not in OUR_SHARES}


def _other(conversion: WeightConversion) -> WeightConversion:
    return next(other for other in WeightConversion if other is not conversion)


def _pod(name: str) -> Pod:
    return next(pod for pod in PODS if pod.name == name)


def _kubelet_files(pod: Pod, conversion: WeightConversion) -> dict[str, str]:
    """The pod slice files kubelet set and nobody else may change.

    An idle cgroup (cpu.idle 1, the BE pods here) reads cpu.weight 0: the kernel pins an
    idle group's weight (sched_group_set_idle), so there kubelet's weight is only checked as
    the slice's CPUWeight property (test_values_kubelet_owns_*)."""
    props = kubelet_slice(pod, conversion)
    owned = {"memory.max": str(props["memory_max"]) if props["memory_max"] is not None else "max"}
    if EXPECTED_POD[pod.name].get("cpu.idle") != "1":
        owned["cpu.weight"] = str(props["cpu_weight"])
    if props["cpu_quota_us"] is not None and "cpu.max" not in EXPECTED_POD[pod.name]:
        owned["cpu.max"] = f"{props['cpu_quota_us']} 100000"
    return owned


def _mismatches(expected: dict[str, str], files: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {name: (want, files.get(name)) for name, want in expected.items() if files.get(name) != want}


# -- the run itself ----------------------------------------------------------------------


def test_the_scenario_ran_to_its_end(node: NodeRun) -> None:
    result = node.result
    assert not result.timed_out, f"the VM did not power off in time ({result.elapsed_s}s)\n{result.console_tail()}"
    assert result.facts.complete, f"the scenario stopped early; facts: {list(result.facts.data)}\n" \
                                  f"{result.console_tail()}"
    errors = {name: data for name, data in result.facts.data.items() if name.endswith("/error")}
    assert not errors, f"steps failed in the guest:\n{show(errors, 12000)}"
    assert not result.facts.errors, result.facts.errors


def test_the_node_runs_its_flavours_runtimes(node: NodeRun, fact: Evidence) -> None:
    # The flavour's containerd answers kubelet's calls (through the proxy) and its runc is the
    # node's; the image's own when the flavour lays none over it.
    want = node.runtimes or {"containerd": "1.7.", "runc": "1.1."}
    answered = fact("start")["runtime-proxy"]["first_call"]
    assert answered["ok"] and want["containerd"] in answered["runtime"], show(answered)
    runc = fact("boot")["runc"]
    assert runc["rc"] == 0 and f"runc version {want['runc']}" in runc["out"], show(runc)


def test_systemd_is_pid_1_with_cgroup_v2_unified(fact: Evidence) -> None:
    boot = fact("boot")
    assert boot["cgroup_fs"] == "cgroup2fs", show(boot)
    assert {"cpuset", "cpu", "memory"} <= set(boot["cgroup_controllers"]), show(boot)
    assert boot["systemd"].startswith("systemd "), show(boot)
    assert boot["containerd"]["ActiveState"] == "active", show(boot)


# -- the units -------------------------------------------------------------------------


def test_runtime_proxy_install_installs_and_starts_both_units(fact: Evidence) -> None:
    done = fact("install")
    assert done["install"]["rc"] == 0, show(done["install"])
    out = done["install"]["out"]
    assert "systemctl enable --now runtime-hooks.service" in out and "runtime-proxy answers through" in out, out
    assert all(done["files"][path] for path in INSTALLED), show(done["files"])


def test_install_dry_run_changes_nothing(fact: Evidence) -> None:
    dry_run = fact("install")["dry_run"]
    assert dry_run["rc"] == 0, show(dry_run)
    assert "would systemctl enable --now runtime-proxy.service" in dry_run["out"], show(dry_run)
    assert not any(dry_run["files_after"].values()), show(dry_run)


def test_kubelet_switched_to_the_proxy_by_its_drop_in(fact: Evidence) -> None:
    before, after = fact("install")["kubelet_before"], fact("install")["kubelet_after"]
    assert before["args"].strip() == KUBELET_OWN_ENDPOINT, show(before)
    assert after["show"]["DropInPaths"] == "/etc/systemd/system/kubelet.service.d/10-runtime-proxy.conf", show(after)
    assert after["args"].strip().endswith(f"--container-runtime-endpoint=unix://{PROXY_SOCKET}"), show(after)
    assert after["show"]["MainPID"] != before["show"]["MainPID"], show([before, after])  # restarted
    assert after["drop_in"] and "Wants=runtime-proxy.service" in after["drop_in"], show(after)


def test_second_install_through_the_host_mount_changes_nothing(fact: Evidence) -> None:
    again = fact("reinstall")
    assert again["install"]["rc"] == 0, show(again)
    assert "nothing to change" in again["install"]["out"], show(again)
    assert "runtime-proxy answers through" in again["install"]["out"], show(again)


def test_uninstall_leaves_the_node_as_it_was(fact: Evidence) -> None:
    gone = fact("uninstall")
    assert gone["uninstall"]["rc"] == 0, show(gone)
    assert "nothing to undo" in gone["again"]["out"], show(gone)
    assert not any(gone["files"].values()), show(gone["files"])
    assert all(u["LoadState"] == "not-found" for u in gone["units"].values()), show(gone["units"])
    assert gone["processes"] == "", show(gone)
    kubelet = gone["kubelet"]
    assert kubelet["show"]["DropInPaths"] == "" and kubelet["drop_in"] is None, show(kubelet)
    assert kubelet["args"].strip() == KUBELET_OWN_ENDPOINT, show(kubelet)
    assert kubelet["show"]["ActiveState"] == "active", show(kubelet)
    assert gone["containerd"]["ActiveState"] == "active", show(gone)


@pytest.mark.parametrize("unit", ["runtime-proxy", "runtime-hooks"])
def test_started_with_systemctl_ready_through_notify(fact: Evidence, unit: str) -> None:
    started = fact("start")[unit]
    state = started["show"]
    assert (state["Type"], state["ActiveState"], state["SubState"]) == ("notify", "active", "running"), show(state)
    assert state["WatchdogUSec"] == "30s", show(state)


def test_proxy_answers_the_first_call_after_start_returns(fact: Evidence) -> None:
    # `systemctl start` of a Type=notify unit returns after READY=1: serving by then.
    first = fact("start")["runtime-proxy"]["first_call"]
    assert first["ok"], show(first)


def test_hook_server_registered_with_the_proxy(fact: Evidence) -> None:
    registration = fact("start")["registration"]
    assert registration and "PreRunPodSandbox" in registration, show(fact("start"))


# -- pods ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", POD_NAMES)
def test_pod_played_through_the_proxy_under_its_systemd_slice(fact: Evidence, name: str) -> None:
    pod = fact(f"pod/{name}")
    assert pod["play"]["ok"], show(pod["play"])
    parent = pod["play"]["json"]["pod"]["cgroup_parent"]
    assert parent == _pod(name).cgroup_parent
    assert pod["pod_cgroup"] == f"/sys/fs/cgroup/{slice_cgroup(_pod(name).slice)}"
    assert pod["containers"] and all(c["exists"] for c in pod["containers"].values()), show(pod["containers"])


@pytest.mark.parametrize("name", POD_NAMES)
def test_pod_slice_has_the_plugins_values(fact: Evidence, name: str) -> None:
    # Read after one more reconcile interval: see test_systemd_resets_* for the moments before.
    files = fact("settle")["after_interval"][name]["pod"]
    wrong = _mismatches(EXPECTED_POD[name], files)
    assert not wrong, f"(expected, found): {show(wrong)}\npod slice files: {show(files)}\n" \
                      f"journal: {show(fact(f'pod/{name}')['journal_hooks'])}"


@pytest.mark.parametrize("name", POD_NAMES)
def test_container_scope_has_the_plugins_values(fact: Evidence, name: str) -> None:
    containers = fact("settle")["after_interval"][name]["containers"]
    files = containers["main"]
    wrong = _mismatches(EXPECTED_CONTAINER[name], files)
    assert not wrong, f"(expected, found): {show(wrong)}\ncontainer scope files: {show(files)}"


@pytest.mark.parametrize("name", POD_NAMES)
def test_values_kubelet_owns_are_left_alone(fact: Evidence, conversion: WeightConversion, name: str) -> None:
    files = fact("settle")["after_interval"][name]["pod"]
    slice_show = fact(f"pod/{name}")["slice_show"]
    wrong = _mismatches(_kubelet_files(_pod(name), conversion), files)
    assert not wrong, f"(kubelet's, found): {show(wrong)}\nslice: {show(slice_show)}"
    want = plugin_weights(conversion).get(name, str(kubelet_slice(_pod(name), conversion)["cpu_weight"]))
    assert slice_show["CPUWeight"] == want, show(slice_show)


def _container_weights(fact: Evidence) -> dict[str, str | None]:
    return {name: fact("settle")["after_interval"][name]["containers"]["main"].get("cpu.weight")
            for name in POD_NAMES}


def test_runc_writes_the_weight_of_its_own_conversion(fact: Evidence, conversion: WeightConversion) -> None:
    # The reference the plugins must rank with: what the node's runc made of kubelet's shares.
    found = _container_weights(fact)
    wrong = _mismatches(runc_weights(conversion), found)
    assert not wrong, f"(runc's {conversion}, found): {show(wrong)}"
    # The pods' shares tell the conversions apart: the other runc's would not match.
    assert _mismatches(runc_weights(_other(conversion)), found), show(found)


def test_plugin_weights_follow_the_runtimes_conversion(fact: Evidence, conversion: WeightConversion) -> None:
    # runtime-hooks runs with the node runc's --cpu-weight-conversion: the BE container's weight
    # (cgroupfs) and its slice's (systemd's CPUWeight) are its batch shares converted as runc would.
    found = {name: _container_weights(fact)[name] for name in OUR_SHARES}
    slices = {name: fact(f"pod/{name}")["slice_show"]["CPUWeight"] for name in OUR_SHARES}
    want = plugin_weights(conversion)
    assert found == want and slices == want, show({"want": want, "containers": found, "slices": slices})
    assert plugin_weights(_other(conversion)) != want


def test_reconciler_repairs_a_value_changed_behind_its_back(fact: Evidence) -> None:
    drift = fact("drift")
    assert drift["written"] == DRIFT["value"], show(drift)
    assert drift["repaired_after_s"] is not None, f"never repaired: {show(drift)}"
    assert drift["after"] == drift["before"], show(drift)


def test_plugin_values_survive_a_systemd_daemon_reload_after_one_reconcile(fact: Evidence) -> None:
    repaired = fact("settle")["after_next_reconcile"]
    wrong = {name: _mismatches(EXPECTED_POD[name], repaired[name]) for name in POD_NAMES}
    assert not any(wrong.values()), show(wrong)


def test_network_plugin_shapes_through_netlink_under_the_hardening(fact: Evidence) -> None:
    tc = fact("network")
    assert "htb 1: root" in tc["qdisc"], show(tc)
    for band in ("1:10", "1:20", "1:30"):
        assert f"class htb {band}" in tc["class"], show(tc)
    # The cgroup classid filter is a BPF program: loading it needs CAP_BPF and bpf(2).
    assert " bpf " in tc["filter"], show(tc)
    denied = [w for w in fact("journal")["runtime-hooks"]["warnings_and_worse"]
              if "not permitted" in str(w.get("MESSAGE"))]
    assert not denied, show(denied)


# -- disturbances ------------------------------------------------------------------------


def test_proxy_restart_mid_lifecycle(fact: Evidence) -> None:
    # Restarted between RunPodSandbox and CreateContainer: the new instance relays the
    # container's calls with the pod known, reaches the hook server, and deletes the pod. (Under
    # TCG the first hook call after the restart may time out connecting; with the Ignore
    # policy that is logged and the reconciler catches up, so the final values are checked.)
    restart = fact("restart")
    journal = restart["journal_proxy"]
    assert restart["play"]["ok"], show(restart["play"])
    assert restart["restart"]["rc"] == 0, show(restart["restart"])
    assert restart["after"]["MainPID"] != restart["before"]["MainPID"], show(restart)
    pod = f"node-tier/node-{RESTART_POD.name}"
    calls = [line for line in journal if ('"CreateContainer"' in line or '"StartContainer"' in line) and pod in line]
    assert len(calls) == 2 and any("runtime-hooks.json:ok" in line for line in calls), show(journal)
    # LS: the burst of its 200m limit, capped at the 20000 us quota.
    assert restart["containers"]["main"]["cpu.max.burst"] == "20000", show(restart["containers"])
    assert restart["delete"]["ok"], show(restart["delete"])
    assert any('"RemovePodSandbox"' in line and pod in line for line in journal), show(journal)


def test_restart_always_after_kill_9(fact: Evidence) -> None:
    killed = fact("kill-9")
    assert killed["back_after_s"] is not None, show(killed)
    assert int(killed["after"]["NRestarts"]) > int(killed["before"]["NRestarts"]), show(killed)
    assert killed["first_call"]["ok"], show(killed)


def test_watchdog_restarts_a_proxy_frozen_with_sigstop(fact: Evidence) -> None:
    frozen = fact("watchdog")
    assert frozen["back_after_s"] is not None, show(frozen)
    assert any("atchdog" in line for line in frozen["journal_systemd"]), show(frozen)
    assert frozen["first_call"]["ok"], show(frozen)


# -- logs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("unit", ["runtime-proxy", "runtime-hooks"])
def test_journal_has_structured_logs_with_priorities(fact: Evidence, unit: str) -> None:
    journal = fact("journal")[unit]
    assert journal["priorities"].get("6", 0) > 0, show(journal)
    assert all(message.lstrip().startswith("{") for message in journal["sample"]), show(journal)
    # journalctl -p warning gives warnings and worse only.
    assert set(journal["filter_warning"]) <= {"0", "1", "2", "3", "4"}, show(journal)


@pytest.mark.parametrize("unit", ["runtime-proxy", "runtime-hooks"])
def test_nothing_failed_under_the_hardening(fact: Evidence, unit: str) -> None:
    # A syscall, capability or path the hardening denies shows up as an error of the unit.
    errors = [w for w in fact("journal")[unit]["warnings_and_worse"] if str(w.get("PRIORITY")) in ("0", "1", "2", "3")]
    assert not errors, show(errors)


def test_malformed_registration_is_a_warning_naming_the_file(fact: Evidence) -> None:
    warnings = fact("journal")["runtime-proxy"]["warnings_and_worse"]
    named = [w for w in warnings if "zz-broken.json" in str(w.get("MESSAGE"))]
    assert named and all(str(w["PRIORITY"]) == "4" for w in named), show(warnings)
