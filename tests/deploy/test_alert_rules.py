"""deploy/prometheus: the alert rules load in Prometheus and pass their unit tests, every alert has
a case where it fires, one where it does not and a runbook section, and what both daemons serve
at /metrics passes ``promtool check metrics``.

promtool comes from Debian's ``prometheus`` package, which ``.ci/system-deps.sh`` installs: a
machine without it fails these tests, never skips them.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import start_testbed
from daemons import HOOKS_CLI, eventually
from hook_servers import write_registration
from hooks_node import Node, metric, policy_text, run_be_pod, write_atomically
from pods import CALL_TIMEOUT
from prometheus_client.parser import text_string_to_metric_families
from test_docs_links import anchors

from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "runtimeproxy-alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "runtimeproxy-alerts.test.yaml"
RUNBOOK = REPO / "docs" / "alerts.md"
RUNBOOK_REFERENCE = "docs/alerts.md"
SEVERITIES = {"critical", "warning"}
PROCESS_METRICS = ("process_resident_memory_bytes", "process_start_time_seconds")
FAILURES = "runtimeproxy_hooks_policy_load_failures_total"


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `bash .ci/system-deps.sh` as root (Debian package prometheus)")
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)


def alerts() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"] if "alert" in rule}


def rule_test_cases() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULE_TESTS.read_text())
    return [case for test in document["tests"] for case in test.get("alert_rule_test", [])]


def runbook_sections() -> dict[str, str]:
    """The runbook's headings that name an alert, by anchor."""
    found = {}
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("### "):
            title = line[4:].strip()
            found[title.lower()] = title
    return found


# -- the rule file ------------------------------------------------------------------------------------


def test_the_rules_pass_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_the_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = rule_test_cases()
    missing = []
    for name in alerts():
        mine = [case for case in cases if case["alertname"] == name]
        if not any(case.get("exp_alerts") for case in mine):
            missing.append(f"{name}: no case where it fires")
        if not any(case.get("exp_alerts") == [] for case in mine):
            missing.append(f"{name}: no case where it stays quiet")
    assert not missing, missing
    assert {case["alertname"] for case in cases} <= set(alerts()), "a case for an alert the rules lack"


def test_every_alert_has_a_severity_its_texts_and_a_runbook_section() -> None:
    sections, problems = runbook_sections(), []
    for name, rule in alerts().items():
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity {rule.get('labels', {}).get('severity')!r}")
        notes = rule.get("annotations", {})
        problems += [f"{name}: no {key}" for key in ("summary", "description") if not notes.get(key)]
        target, _, anchor = notes.get("runbook_url", "").partition("#")
        if target != RUNBOOK_REFERENCE or anchor not in anchors(RUNBOOK):
            problems.append(f"{name}: runbook_url {notes.get('runbook_url')!r} names no heading of {RUNBOOK_REFERENCE}")
        elif sections.get(anchor) != name:
            problems.append(f"{name}: its runbook section is titled {sections.get(anchor)!r}")
    assert not problems, problems
    assert set(sections.values()) == set(alerts()), "a runbook section for an alert the rules lack"


# -- the daemons' metrics --------------------------------------------------------------------------------


class MonitoredNode(Node):
    """The proxy and runtime-hooks of tests/hooks_node.py, the proxy serving metrics too."""

    def proxy_args(self) -> list[str]:
        return [*super().proxy_args(), "--metrics-address", "127.0.0.1:0"]

    def proxy_metrics(self) -> str:
        assert self.proxy is not None
        ready = self.proxy.wait_record(lambda r: r.get("event") == "ready")
        with urllib.request.urlopen(f"http://{ready['metrics_address']}/metrics", timeout=10) as reply:
            return str(reply.read().decode())


@pytest.fixture
def node(containerd: Containerd) -> Iterator[MonitoredNode]:
    with closing(MonitoredNode(containerd)) as made:
        yield made


@pytest.fixture
def nri_node() -> Iterator[MonitoredNode]:
    """A node of a containerd 1.7 test bed with NRI on, of its own."""
    bed = start_testbed("1.7", nri=True)
    try:
        with closing(MonitoredNode(bed)) as made:
            yield made
    finally:
        bed.stop()


def shown_policy_hash(policy: Path) -> str:
    """What an operator computes on a node: the SHA-256 of `runtime-hooks policy show`'s YAML
    (below its comment line), cut to 12 digits."""
    shown = subprocess.run(
        [*HOOKS_CLI, "policy", "show", "--policy", str(policy)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    header, _, document = shown.partition("\n")
    assert header.startswith("# effective runtime-hooks policy"), shown
    return hashlib.sha256(document.encode()).hexdigest()[:12]


@pytest.mark.e2e
@pytest.mark.containerd_series("1.6")
def test_both_daemons_metrics_pass_promtool_check_metrics(node: MonitoredNode) -> None:
    # A Fail server for a hook point no call here reaches: its refusal counter is there at 0.
    node.config_dir.mkdir(parents=True, exist_ok=True)
    write_registration(
        node.config_dir,
        "zz-fail.json",
        str(node.workdir / "gone.sock"),
        [HookPoint.PRE_REMOVE_POD_SANDBOX],
        policy="Fail",
    )
    node.start(policy_text(interval=0.5))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        run_be_pod(node, cri)  # hook calls, plugin calls and their histograms get samples
    proxy = node.proxy_metrics()
    assert_clean_metrics("runtime-proxy", proxy)
    refusals = {"method": "RemovePodSandbox", "server": "zz-fail.json", "hook": "PreRemovePodSandbox"}
    assert metric(proxy, "runtimeproxy_cri_calls_refused_total", **refusals) == 0
    assert metric(proxy, "runtimeproxy_hook_layer_errors_total", method="RunPodSandbox", action="refused") == 0
    called = {"server": "runtime-hooks.json", "hook": "PreRunPodSandbox", "outcome": "ok"}
    assert (metric(proxy, "runtimeproxy_hook_calls_total", **called) or 0) > 0
    assert_alerted_counters_at_zero("runtime-proxy", proxy, ("runtimeproxy_cri_", "runtimeproxy_hook_"))
    assert_hooks_metrics(node)
    assert_alerted_counters_at_zero("runtime-hooks", node.hooks_metrics(), ("runtimeproxy_hooks_",))


@pytest.mark.e2e
@pytest.mark.containerd_series("1.6")
def test_a_refused_policy_is_counted_and_a_reload_replaces_the_hash(node: MonitoredNode) -> None:
    node.start(policy_text(interval=0.5))
    first = shown_policy_hash(node.policy)
    write_atomically(node.policy, policy_text(interval=0.5, be_l3=(30, 20)))  # start above end: invalid
    eventually(lambda: node.hooks_metric(FAILURES, cause="invalid") == 1, 5.0, node.hooks_log)
    assert policy_hashes(node.hooks_metrics()) == {first: 1.0}
    write_atomically(node.policy, policy_text(interval=0.5, be_l3=(0, 50)))
    second = shown_policy_hash(node.policy)
    assert second != first
    eventually(lambda: policy_hashes(node.hooks_metrics()) == {second: 1.0}, 5.0, node.hooks_log)


@pytest.mark.e2e
def test_runtime_hooks_metrics_in_nri_mode_pass_promtool_check_metrics(nri_node: MonitoredNode) -> None:
    node = nri_node
    write_atomically(node.policy, policy_text(interval=0.5))
    args, env = node.hooks_command("--nri-socket", str(node.containerd.nri_socket))
    at = args.index("--hook-config-dir")
    del args[at : at + 2]  # NRI mode alone
    node.hooks = node.start_daemon("hooks-nri", args, env)
    ready = node.hooks.wait_record(lambda r: r.get("event") == "ready")
    node.metrics_url = f"http://{ready['metrics_address']}/metrics"
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:  # containerd itself
        run_be_pod(node, cri)
    assert metric(node.hooks_metrics(), "runtimehooks_nri_connected") == 1
    assert_hooks_metrics(node)
    assert_alerted_counters_at_zero("runtime-hooks", node.hooks_metrics(), ("runtimeproxy_hooks_", "runtimehooks_"))


# increase(NAME{matchers}[window]) in an alert's expression, and one label matcher.
INCREASE = re.compile(r"increase\((\w+)(?:\{([^}]*)\})?\[")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def increase_selectors() -> dict[str, list[tuple[str, str, str]]]:
    """The counters the alerts take increase() of, with the label matchers they select by."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for rule in alerts().values():
        for name, matchers in INCREASE.findall(rule["expr"]):
            found[name] = MATCHER.findall(matchers)
    return found


def selected(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    """Whether PromQL's matchers pick a series with ``labels`` (regexes match whole values)."""
    for label, op, value in matchers:
        have = labels.get(label, "")
        hit = re.fullmatch(value, have) is not None if op in ("=~", "!~") else have == value
        if hit != (op in ("=", "=~")):
            return False
    return True


def assert_alerted_counters_at_zero(daemon: str, text: str, prefixes: tuple[str, ...]) -> None:
    """Each counter (named with one of ``prefixes``) that an alert takes increase() of has, before
    anything failed, series the alert's selector picks, at 0: the first failure is then an
    increase. A series born with its first count would have no earlier sample to increase from."""
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    counters = {name: matchers for name, matchers in increase_selectors().items() if name.startswith(prefixes)}
    assert counters, (daemon, prefixes)
    for name, matchers in counters.items():
        picked = [sample for sample in samples if sample.name == name and selected(sample.labels, matchers)]
        assert picked, f"{daemon}: no series of {name} an alert could see increase"
        assert {sample.value for sample in picked} == {0.0}, (daemon, name, picked)


def assert_clean_metrics(daemon: str, text: str) -> None:
    """``promtool check metrics`` finds nothing to say, and the process metrics are there."""
    result = promtool("check", "metrics", stdin=text)
    assert (result.returncode, result.stdout + result.stderr) == (0, ""), daemon
    for name in PROCESS_METRICS:
        assert (metric(text, name) or 0) > 0, (daemon, name)


def assert_hooks_metrics(node: MonitoredNode) -> None:
    """runtime-hooks' scrape is clean and shows its policy: one info series with the hash an
    operator computes from `policy show`, a load time, and every failure cause at 0."""
    hooks = node.hooks_metrics()
    assert_clean_metrics("runtime-hooks", hooks)
    assert policy_hashes(hooks) == {shown_policy_hash(node.policy): 1.0}
    assert (metric(hooks, "runtimeproxy_hooks_policy_last_load_timestamp_seconds") or 0) > 0
    for cause in ("unreadable", "encoding", "yaml", "invalid", "removed"):
        assert metric(hooks, FAILURES, cause=cause) == 0, cause


def policy_hashes(text: str) -> dict[str, float]:
    """The runtimeproxy_hooks_policy_info series in a scrape, by hash."""
    return {
        sample.labels["hash"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "runtimeproxy_hooks_policy_info"
    }
