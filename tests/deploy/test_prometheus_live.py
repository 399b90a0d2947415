"""The dashboard's queries and the alert rules against a real Prometheus scraping both daemons.

Prometheus (Debian's ``prometheus``, a test dependency .ci/system-deps.sh installs) runs on
127.0.0.1 with a 1 s scrape interval and the alert rules of deploy/prometheus loaded. It scrapes
two nodes of the containerd 1.7 test bed: runtime-proxy (job ``runtime-proxy``) with
runtime-hooks behind it (job ``runtime-hooks``), and runtime-hooks as the NRI plugin of a second
containerd (job ``runtime-hooks``). Pods go through their whole lifecycle on both; through the
proxy also a call the runtime answers NotFound, two plugins that set the same variable (a plugin
overwrite), a container a Fail plugin refuses, and a cgroup value changed behind the plugins'
back (a reconcile repair).

Then every query of deploy/grafana/runtimeproxy.json, with the node variable set to the scraped
nodes, must return series; and every alert expression must evaluate, its rule be healthy, and
each metric it names be exported (series, or a family with no sample yet): a misspelt metric
name fails the test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from conftest import start_testbed
from daemons import eventually
from dashboard_json import REPO, committed, expressions, variables
from hooks_node import Node, policy_text, run_be_pod, run_ls_pod
from pods import CALL_TIMEOUT, Pod, cgroup_dir

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.containerd_series("1.7")]

PROMETHEUS = "/usr/bin/prometheus"
ALERTS = REPO / "deploy" / "prometheus" / "runtimeproxy-alerts.yaml"
PROXY_JOB, HOOKS_JOB = "runtime-proxy", "runtime-hooks"
# What Grafana's interval variables become: longer than the whole test, so that a rate sees
# every sample since Prometheus started.
WINDOW = "10m"
DATA_TIMEOUT = 20.0  # for the last scrapes and rule evaluations to land
REFUSED = "refused"  # the container name the Fail plugin refuses

# Two plugins setting the same variable (the later one overwrites: a plugin overwrite); the
# later one has failure policy Fail and fails for one container name (a Fail refusal).
PLUGINS = f"""\
from runtimeproxy.hooks.sdk import HookPoint, Plugin

first = Plugin("dash-first", version="0.1", order=30, failure_policy="ignore", timeout=1.0)
second = Plugin("dash-second", version="0.1", order=31, failure_policy="fail", timeout=1.0)


@first.on(HookPoint.PRE_CREATE_CONTAINER)
def stamp_first(*, response, **kwargs):
    response.env.set("DASH_OWNER", "first")


@second.on(HookPoint.PRE_CREATE_CONTAINER)
def stamp_second(*, container, response, **kwargs):
    if container.name == "{REFUSED}":
        raise RuntimeError("dash-second refuses this container")
    response.env.set("DASH_OWNER", "second")
"""
PLUGINS_DIST = "rtpx_dash_plugins-0.1.dist-info"
PLUGINS_ENTRY_POINTS = (
    "[runtimeproxy.hooks]\ndash-first = rtpx_dash_plugins:first\ndash-second = rtpx_dash_plugins:second\n"
)


class ProxyNode(Node):
    """The proxy (metrics on a free port) with runtime-hooks and the two plugins above."""

    def proxy_args(self) -> list[str]:
        return [*super().proxy_args(), "--metrics-address", "127.0.0.1:0"]

    def _write_extra_plugins(self) -> Path:
        directory = self.workdir / "dash-plugins"
        (directory / PLUGINS_DIST).mkdir(parents=True)
        (directory / "rtpx_dash_plugins.py").write_text(PLUGINS)
        (directory / PLUGINS_DIST / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: rtpx-dash-plugins\nVersion: 0.1\n"
        )
        (directory / PLUGINS_DIST / "entry_points.txt").write_text(PLUGINS_ENTRY_POINTS)
        return directory

    def proxy_metrics_address(self) -> str:
        assert self.proxy is not None
        return str(self.proxy.wait_record(lambda r: r.get("event") == "ready")["metrics_address"])


class NriNode(Node):
    """runtime-hooks alone, as the NRI plugin of the test bed (no proxy, no registration)."""

    def start_nri(self, policy: str) -> None:
        self.policy.write_text(policy)
        args, env = self.hooks_command("--nri-socket", str(self.containerd.nri_socket))
        at = args.index("--hook-config-dir")
        del args[at : at + 2]
        self.hooks = self.start_daemon("hooks-nri", args, env)
        ready = self.hooks.wait_record(lambda r: r.get("event") == "ready")
        self.metrics_url = f"http://{ready['metrics_address']}/metrics"


# -- Prometheus -------------------------------------------------------------------------------------


class PromqlError(AssertionError):
    """Prometheus answered a query with an error."""


@dataclass
class Prometheus:
    """A Prometheus server on 127.0.0.1 and its HTTP API."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
                answer = json.loads(reply.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad expression
            answer = json.loads(exc.read())
        if answer.get("status") != "success":
            raise PromqlError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) of ``expr`` now."""
        data = self.api("query", query=expr)
        result = data["result"]
        return [{"metric": {}, "value": result}] if data["resultType"] == "scalar" else list(result)

    def series(self, match: str) -> list[dict[str, str]]:
        found: list[dict[str, str]] = self.api("series", **{"match[]": match, "start": str(time.time() - 600)})
        return found


def prometheus_config(proxy: list[str], hooks: list[str], rules: Path) -> str:
    def job(name: str, targets: list[str]) -> dict[str, Any]:
        return {"job_name": name, "scrape_interval": "1s", "static_configs": [{"targets": targets}]}

    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [job(PROXY_JOB, proxy), job(HOOKS_JOB, hooks)],
    }
    return yaml.safe_dump(config)


def start_prometheus(workdir: Path, config: str) -> Prometheus:
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} is missing: run `bash .ci/system-deps.sh` (Debian package prometheus)")
    (workdir / "prometheus.yml").write_text(config)
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        eventually(lambda: _ready(server), 30.0, log.read_text)
    except BaseException:
        server.stop()
        raise
    return server


def _ready(server: Prometheus) -> bool:
    if server.process.poll() is not None:
        raise AssertionError(f"prometheus exited {server.process.returncode}:\n{server.log.read_text()}")
    try:
        with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def scraped_since(prometheus: Prometheus, since: float, targets: int) -> None:
    """Wait until each of the ``targets`` scrape targets is up and was scraped after ``since``."""
    expr = f'timestamp(up{{job=~"{PROXY_JOB}|{HOOKS_JOB}"}} == 1) > {since}'
    eventually(lambda: len(prometheus.query(expr)) == targets, DATA_TIMEOUT, prometheus.log.read_text)


# -- the fleet --------------------------------------------------------------------------------------


@dataclass
class Fleet:
    prometheus: Prometheus
    proxy_node: ProxyNode
    nri_node: NriNode


@pytest.fixture(scope="module")
def nri_containerd() -> Iterator[Containerd]:
    bed = start_testbed("1.7", nri=True)
    yield bed
    bed.stop()


@pytest.fixture(scope="module")
def fleet(containerd: Containerd, nri_containerd: Containerd) -> Iterator[Fleet]:
    """Both nodes started, Prometheus scraping them, and the pods played (see the module doc)."""
    workdir = Path(tempfile.mkdtemp(prefix="rtpx-prom-"))
    with closing(ProxyNode(containerd)) as proxy_node, closing(NriNode(nri_containerd)) as nri_node:
        proxy_node.start(policy_text(interval=0.5), extra_plugins=True)
        nri_node.start_nri(policy_text(interval=0.5))
        targets = [proxy_node.metrics_url, nri_node.metrics_url]
        hooks = [urllib.parse.urlsplit(url).netloc for url in targets]
        config = prometheus_config([proxy_node.proxy_metrics_address()], hooks, ALERTS)
        prometheus = start_prometheus(workdir, config)
        try:
            play_proxy_node(proxy_node)
            play_nri_node(nri_node)
            scraped_since(prometheus, time.time(), len(hooks) + 1)
            yield Fleet(prometheus, proxy_node, nri_node)
        finally:
            prometheus.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def play_proxy_node(node: ProxyNode) -> None:
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        ls_pod, be_pod = run_ls_pod(node, cri), run_be_pod(node, cri)
        with pytest.raises(grpc.RpcError) as refused:
            create_container(node, cri, ls_pod, REFUSED)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        with pytest.raises(grpc.RpcError) as missing:
            cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id="no-such-container"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND, missing.value
        drift_be_pod_quota(node, be_pod)
        for pod in (ls_pod, be_pod):
            end_pod(cri, pod)


def create_container(node: Node, cri: CriClient, pod: Pod, name: str) -> str:
    status = cri.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod.sandbox_id))
    config = pb.PodSandboxConfig(
        metadata=status.status.metadata, linux=pb.LinuxPodSandboxConfig(cgroup_parent=pod.parent)
    )
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image=node.containerd.test_image),
        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpu_shares=2)),
    )
    request = pb.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id, config=container, sandbox_config=config)
    return str(cri.runtime.CreateContainer(request, timeout=CALL_TIMEOUT).container_id)


def drift_be_pod_quota(node: Node, pod: Pod) -> None:
    """Change the BE pod's CFS quota behind the plugins' back until a reconcile round puts it back."""
    before = node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="cpu")
    quota = cgroup_dir("cpu", pod.parent) / "cpu.cfs_quota_us"
    quota.write_text("500000")
    eventually(
        lambda: node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="cpu") > before, 10.0, node.hooks_log
    )


def end_pod(cri: CriClient, pod: Pod) -> None:
    """What kubelet does when a pod goes: stop and remove its containers, then its sandbox."""
    for container_id in pod.containers.values():
        cri.runtime.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=1), timeout=CALL_TIMEOUT)
        cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
    cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id), timeout=CALL_TIMEOUT)
    cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id), timeout=CALL_TIMEOUT)


def play_nri_node(node: NriNode) -> None:
    """A pod straight on the runtime, which calls runtime-hooks over NRI."""
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        end_pod(cri, run_be_pod(node, cri))
    eventually(
        lambda: node.hooks_metric("runtimehooks_nri_events_total", event="RemovePodSandbox", outcome="ok"),
        10.0,
        node.hooks_log,
    )


# -- PromQL -----------------------------------------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORDS = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "atan2"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels or keywords)."""
    bare = _STRINGS.sub('""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)  # label matchers, ranges and subqueries
    bare = _GROUPINGS.sub(" ", bare)
    return {word for word in _WORDS.findall(bare) if word.lower() not in _KEYWORDS}


def test_metric_names_of_an_expression() -> None:
    expr = (
        'sum by (job) (rate(foo_total{code!="OK", x=~"a|b"}[5m] offset 1m)) > 0.5e3 '
        'and on (instance) group_left (hash) bar:ratio unless absent(baz{job="x"}) or vector(1)'
    )
    assert metric_names(expr) == {"foo_total", "bar:ratio", "baz"}


def node_regex(prometheus: Prometheus, board: dict[str, Any]) -> str:
    """What Grafana puts for ``$node`` with every node selected: the variable's query (the
    instances of its selector) through its regex, escaped and joined as a regex."""
    node = variables(board)["node"]
    query = re.fullmatch(r"label_values\((.*), instance\)", node["query"])
    assert query is not None, node["query"]
    regex = re.compile(node["regex"].strip("/"))
    hosts = set()
    for series in prometheus.series(query.group(1)):
        match = regex.match(series["instance"])
        assert match is not None, series
        hosts.add(match.group(1))
    assert hosts, f"the node variable's query {node['query']} finds no instance"
    return "(" + "|".join(grafana_regex_escape(host) for host in sorted(hosts)) + ")"


def grafana_regex_escape(value: str) -> str:
    """A value of a multi-value variable as Grafana writes it into a Prometheus regex matcher:
    each regex metacharacter escaped with a backslash that is itself escaped for the quoted string."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda match: "\\\\" + match.group(0), value)


def grafana_expr(expr: str, nodes: str) -> str:
    for variable, value in (("$__rate_interval", WINDOW), ("$__range", WINDOW), ("$__interval", WINDOW)):
        expr = expr.replace(variable, value)
    expr = expr.replace("$node", nodes)
    assert "$" not in expr, f"a dashboard variable the test does not know: {expr}"
    return expr


def results_of(prometheus: Prometheus, queries: dict[str, str]) -> dict[str, int]:
    """Each query's number of series, polled until every one has some or DATA_TIMEOUT passed."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + DATA_TIMEOUT
    while True:
        counts = {key: len(prometheus.query(expr)) for key, expr in queries.items()}
        if all(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(1.0)


# -- the tests --------------------------------------------------------------------------------------


def test_every_dashboard_query_returns_series(fleet: Fleet) -> None:
    board = committed()
    nodes = node_regex(fleet.prometheus, board)
    assert nodes == r"(127\\.0\\.0\\.1)", nodes  # every target of the test bed is on this host
    queries = {f"{title}: {expr}": grafana_expr(expr, nodes) for title, expr in expressions(board)}
    counts = results_of(fleet.prometheus, queries)
    assert [query for query, count in counts.items() if not count] == []


def test_policy_table_shows_each_instance(fleet: Fleet) -> None:
    """One row per runtime-hooks (proxy mode and NRI mode), equal policies, equal hashes."""
    rows = fleet.prometheus.query("max by (instance, hash) (runtimeproxy_hooks_policy_info)")
    assert len(rows) == 2, rows
    assert len({row["metric"]["hash"] for row in rows}) == 1, rows


def alert_rules() -> list[dict[str, Any]]:
    if not ALERTS.exists():
        pytest.fail(f"{ALERTS.relative_to(REPO)} is missing")
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert rules, f"{ALERTS} holds no rule"
    return rules


def test_alert_expressions_evaluate_on_real_metrics(fleet: Fleet) -> None:
    rules = alert_rules()
    wrong = []
    for rule in rules:
        name = rule.get("alert") or rule.get("record")
        try:
            fleet.prometheus.query(rule["expr"])
        except PromqlError as exc:
            wrong.append(f"{name}: {exc}")
            continue
        wrong += [f"{name}: no daemon exports {metric}" for metric in sorted(metric_names(rule["expr"]))
                  if not exported(fleet.prometheus, metric)]  # fmt: skip
    assert wrong == []


def exported(prometheus: Prometheus, metric: str) -> bool:
    """Whether ``metric`` has series, or its family is exported with no sample yet: a labelled
    counter whose first event the test bed cannot cause (Prometheus keeps the family's HELP and
    TYPE as metadata, named without the sample suffix)."""
    family = re.sub(r"_(total|bucket|count|sum|created)$", "", metric)
    if any(prometheus.api("metadata", metric=name) for name in {metric, family}):
        return True
    deadline = time.monotonic() + DATA_TIMEOUT
    while not prometheus.query(f"count({{__name__={json.dumps(metric)}}})"):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def test_alert_rules_load_and_evaluate_healthy(fleet: Fleet) -> None:
    """Prometheus loaded every rule of the file and evaluates each without an error."""
    expected = {rule.get("alert") or rule.get("record") for rule in alert_rules()}

    def evaluated() -> list[dict[str, Any]] | None:
        loaded = [rule for group in fleet.prometheus.api("rules")["groups"] for rule in group["rules"]]
        done = all(rule.get("health") != "unknown" for rule in loaded)
        return loaded if loaded and done else None

    loaded = eventually(evaluated, DATA_TIMEOUT, fleet.prometheus.log.read_text)
    assert {rule["name"] for rule in loaded} == expected
    assert [(rule["name"], rule.get("lastError")) for rule in loaded if rule["health"] != "ok"] == []
