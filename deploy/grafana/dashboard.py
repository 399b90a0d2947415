"""The Grafana dashboard of runtime-proxy and runtime-hooks, written as JSON beside this file.

Run ``python deploy/grafana/dashboard.py`` after changing a panel (it rewrites
runtimeproxy.json; a test checks that the committed file is what this prints). The panels read
the metrics both daemons export (docs/dashboard.md says what each shows). Every query filters
on the ``node`` variable: the hosts of the scrape targets of the jobs ``runtime-proxy`` and
``runtime-hooks``, so that one node's two daemons (two ports, one host) are one choice.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).with_name("runtimeproxy.json")
UID = "runtimeproxy"

PROXY_JOB = "runtime-proxy"
HOOKS_JOB = "runtime-hooks"
JOBS = f'job=~"{PROXY_JOB}|{HOOKS_JOB}"'
# A target's host: its instance without the port (a node's daemons listen on two ports).
NODE_REGEX = "/^(.*?)(:[0-9]+)?$/"
NODE = 'instance=~"$node(:[0-9]+)?"'
NOT_OK = 'code!="OK"'
RATE = "$__rate_interval"
RANGE = "$__range"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    table: bool = False  # an instant query shown as a table


@dataclass(frozen=True)
class Panel:
    kind: str  # timeseries, stat or table
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def selector(metric: str, *matchers: str) -> str:
    """``metric`` on the selected nodes (and ``matchers``)."""
    return f"{metric}{{{', '.join((*matchers, NODE))}}}"


def rate(metric: str, *matchers: str) -> str:
    return f"rate({selector(metric, *matchers)}[{RATE}])"


def increase(metric: str, *matchers: str, window: str = RATE) -> str:
    return f"increase({selector(metric, *matchers)}[{window}])"


def quantile(q: float, bucket: str, by: str = "") -> str:
    labels = ", ".join(("le", *by.split(", "))) if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) ({rate(bucket)}))"


def quantiles(bucket: str, by: str = "") -> tuple[Query, ...]:
    prefix = "".join(f"{{{{{label}}}}} " for label in by.split(", ")) if by else ""
    return tuple(Query(quantile(q, bucket, by), f"{prefix}p{round(q * 100)}") for q in (0.5, 0.9, 0.99))


def timeseries_panel(title: str, description: str, *queries: Query, unit: str = "short", width: int = 12) -> Panel:
    return Panel("timeseries", title, description, queries, unit, width)


def stat_panel(title: str, description: str, *queries: Query, unit: str = "short") -> Panel:
    return Panel("stat", title, description, queries, unit, width=6, height=5)


DISTINCT_POLICIES = f"count by (group) (count by (group, hash) ({selector('runtimeproxy_hooks_policy_info')}))"

OVERVIEW = Row(
    "Overview",
    (
        stat_panel(
            "Daemons up",
            "Scrape targets answering, by job: a node runs one runtime-proxy and one runtime-hooks.",
            Query(f"sum by (job) ({selector('up', JOBS)})", "{{job}}"),
        ),
        stat_panel(
            "Distinct policies in force",
            "How many different runtime-hooks policies the selected nodes run, by node group (the "
            "target label `group`, if set): 1 when all nodes of a group agree.",
            Query(DISTINCT_POLICIES, "policies {{group}}"),
        ),
        stat_panel(
            "Fail refusals in range",
            "CRI calls refused because a pre-hook of a hook server with failure policy Fail failed.",
            Query(f"sum({increase('runtimeproxy_cri_calls_refused_total', window=RANGE)})", "refused"),
        ),
        stat_panel(
            "Daemon restarts in range",
            "Changes of process_start_time_seconds: each is a daemon process that started again.",
            Query(f"sum by (job) (changes({selector('process_start_time_seconds', JOBS)}[{RANGE}]))", "{{job}}"),
        ),
    ),
)

CRI = Row(
    "CRI calls (runtime-proxy)",
    (
        timeseries_panel(
            "CRI calls by method",
            "Calls the proxy relayed, per second, by CRI method.",
            Query(f"sum by (method) ({rate('runtimeproxy_cri_calls_total')})", "{{method}}"),
            unit="reqps",
        ),
        timeseries_panel(
            "CRI errors by method and code",
            "Relayed calls that ended with a gRPC status other than OK, per second. The runtime's own "
            "answers (NotFound for a gone container) are normal in small numbers; FailedPrecondition, "
            "Unavailable or DeadlineExceeded from a hook refusal show in the hooks row too.",
            Query(f"sum by (method, code) ({rate('runtimeproxy_cri_calls_total', NOT_OK)})", "{{method}} {{code}}"),
            unit="reqps",
        ),
        timeseries_panel(
            "Relay latency, all methods",
            "Time from receiving a CRI call to sending its status, hooks included: percentiles of "
            "runtimeproxy_cri_call_duration_seconds over the selected nodes.",
            *quantiles("runtimeproxy_cri_call_duration_seconds_bucket"),
            unit="s",
        ),
        timeseries_panel(
            "Relay latency p99 by method",
            "The slowest methods: RunPodSandbox and CreateContainer take the runtime's time plus the pre-hooks'.",
            Query(quantile(0.99, "runtimeproxy_cri_call_duration_seconds_bucket", "method"), "{{method}}"),
            unit="s",
        ),
        timeseries_panel(
            "Calls in flight and connections",
            "CRI calls being relayed now, and the proxy's open connections (client: kubelet and other "
            "CRI clients; backend: to the runtime).",
            Query(f"sum by (instance) ({selector('runtimeproxy_cri_calls_in_flight')})", "in flight {{instance}}"),
            Query(f"sum by (side) ({selector('runtimeproxy_connections')})", "connections {{side}}"),
            width=24,
        ),
    ),
)

HOOKS = Row(
    "Hook calls (runtime-proxy to hook servers)",
    (
        timeseries_panel(
            "Hook calls by server, hook point and outcome",
            "Hook server calls per second. Outcomes other than ok and unregistered are failures: "
            "under failure policy Fail they refuse the CRI call, under Ignore it goes on unchanged.",
            Query(
                f"sum by (server, hook, outcome) ({rate('runtimeproxy_hook_calls_total')})",
                "{{server}} {{hook}} {{outcome}}",
            ),
            unit="reqps",
        ),
        timeseries_panel(
            "Hook latency p99 by server and hook point",
            "Round trip of hook server calls (runtimeproxy_hook_duration_seconds). A hook point near its "
            "server's timeout will soon time out.",
            Query(quantile(0.99, "runtimeproxy_hook_duration_seconds_bucket", "server, hook"), "{{server}} {{hook}}"),
            unit="s",
        ),
        timeseries_panel(
            "Fail refusals by method, server and hook point",
            "CRI calls refused because a Fail server's pre-hook failed (runtimeproxy_cri_calls_refused_total). "
            "Anything above zero means pods are not starting: read the proxy's log for the server's answer.",
            Query(
                f"sum by (method, server, hook) ({increase('runtimeproxy_cri_calls_refused_total')})",
                "{{method}} {{server}} {{hook}}",
            ),
        ),
        timeseries_panel(
            "Hook latency, all servers and hook points",
            "Percentiles of the hook round trip over every server and hook point of the selected nodes.",
            *quantiles("runtimeproxy_hook_duration_seconds_bucket"),
            unit="s",
        ),
    ),
)

PLUGINS = Row(
    "Plugins (runtime-hooks)",
    (
        timeseries_panel(
            "Plugin calls by plugin, hook and outcome",
            "Plugin handler calls per second (outcomes: ok, error, timeout, invalid, busy).",
            Query(
                f"sum by (plugin, hook, outcome) ({rate('runtimeproxy_hooks_plugin_calls_total')})",
                "{{plugin}} {{hook}} {{outcome}}",
            ),
            unit="reqps",
        ),
        timeseries_panel(
            "Plugin call latency p99 by plugin",
            "Time a plugin handler took, up to its timeout.",
            Query(quantile(0.99, "runtimeproxy_hooks_plugin_call_duration_seconds_bucket", "plugin"), "{{plugin}}"),
            unit="s",
        ),
        timeseries_panel(
            "Plugin overwrites by field",
            "Values one plugin set that a later plugin replaced in the same hook call: two plugins "
            "disagree about a field; the later one (higher order) wins.",
            Query(
                f"sum by (field) ({increase('runtimeproxy_hooks_plugin_overwrites_total')})",
                "{{field}}",
            ),
            width=24,
        ),
    ),
)

RECONCILE = Row(
    "Reconcile and repair (runtime-hooks)",
    (
        timeseries_panel(
            "Reconcile repairs by plugin",
            "Values a plugin's reconcile found drifted from what it owns and set back. A steady rate "
            "means something else on the node keeps writing the same files.",
            Query(
                f"sum by (plugin) ({increase('runtimehooks_reconcile_drift_total')})",
                "{{plugin}}",
            ),
        ),
        timeseries_panel(
            "Containers repaired and repairs failed",
            "Containers whose resources differed from what the plugins set and were set back (reason "
            "unhooked: created while runtime-hooks was away; drifted: the cgroup changed), and repairs "
            "the runtime or the kernel refused.",
            Query(
                f"sum by (mode, reason) ({increase('runtimeproxy_hooks_containers_repaired_total')})",
                "repaired {{mode}} {{reason}}",
            ),
            Query(
                f"sum by (mode) ({increase('runtimeproxy_hooks_container_repairs_failed_total')})",
                "failed {{mode}}",
            ),
        ),
        timeseries_panel(
            "Reconcile round duration",
            "Time one reconcile round took (listing the runtime's pods and every plugin's reconcile). "
            "Rounds longer than the interval fall behind.",
            *quantiles("runtimehooks_reconcile_duration_seconds_bucket"),
            unit="s",
        ),
        timeseries_panel(
            "Reconcile rounds by result",
            "Rounds per second: ok, plugin_failures (a plugin's reconcile failed), runtime_error (the "
            "runtime could not be listed).",
            Query(f"sum by (result) ({rate('runtimehooks_reconcile_rounds_total')})", "{{result}}"),
            unit="ops",
        ),
    ),
)

NRI = Row(
    "NRI (runtime-hooks as an NRI plugin)",
    (
        timeseries_panel(
            "NRI connection state",
            "1 while runtime-hooks is registered with the runtime's NRI, by instance; reconnects are "
            "registrations after a lost connection (a runtime restart).",
            Query(f"max by (instance) ({selector('runtimehooks_nri_connected')})", "connected {{instance}}"),
            Query(
                f"sum by (instance) ({increase('runtimehooks_nri_reconnects_total')})",
                "reconnects {{instance}}",
            ),
        ),
        timeseries_panel(
            "NRI events by event and outcome",
            "NRI events handled per second: ok, failed (a Fail plugin failed and the runtime was told), "
            "deadline (answered unchanged before NRI's timeout), error.",
            Query(f"sum by (event, outcome) ({rate('runtimehooks_nri_events_total')})", "{{event}} {{outcome}}"),
            unit="ops",
        ),
        timeseries_panel(
            "NRI event latency p99 by event",
            "Time from an NRI event's arrival to its answer.",
            Query(quantile(0.99, "runtimehooks_nri_event_duration_seconds_bucket", "event"), "{{event}}"),
            unit="s",
            width=24,
        ),
    ),
)

POLICY = Row(
    "Policy (runtime-hooks)",
    (
        Panel(
            "table",
            "Policy hash by instance",
            "The hash of the policy each runtime-hooks runs (first 12 hex digits of the SHA-256 of "
            "`runtime-hooks policy show`): nodes with equal policies show equal hashes.",
            (Query(f"max by (instance, hash) ({selector('runtimeproxy_hooks_policy_info')})", table=True),),
        ),
        timeseries_panel(
            "Distinct policies and load failures",
            "How many different policies are in force (by node group), and versions of the policy file that were not "
            "put in force (the last good policy stays), by cause.",
            Query(DISTINCT_POLICIES, "distinct policies {{group}}"),
            Query(
                f"sum by (cause) ({increase('runtimeproxy_hooks_policy_load_failures_total')})",
                "load failures {{cause}}",
            ),
        ),
        timeseries_panel(
            "Time since the last policy load",
            "Seconds since each runtime-hooks last read a valid policy (or put the built-in defaults in force).",
            Query(f"time() - {selector('runtimeproxy_hooks_policy_last_load_timestamp_seconds')}", "{{instance}}"),
            unit="s",
            width=24,
        ),
    ),
)

PROCESSES = Row(
    "Daemon processes",
    (
        timeseries_panel(
            "Daemon restarts",
            "Changes of process_start_time_seconds by daemon: a restart of runtime-proxy or runtime-hooks.",
            Query(f"changes({selector('process_start_time_seconds', JOBS)}[{RATE}])", "{{job}} {{instance}}"),
        ),
        timeseries_panel(
            "Resident memory",
            "RSS of each daemon (process_resident_memory_bytes).",
            Query(f"{selector('process_resident_memory_bytes', JOBS)}", "{{job}} {{instance}}"),
            unit="bytes",
        ),
        timeseries_panel(
            "CPU",
            "CPU time each daemon used, in cores.",
            Query(rate("process_cpu_seconds_total", JOBS), "{{job}} {{instance}}"),
            unit="percentunit",
        ),
        timeseries_panel(
            "HTTP/2 peers cut off for going over a limit",
            "Connections closed with ENHANCE_YOUR_CALM because the peer broke a limit, by peer and limit.",
            Query(
                f"sum by (job, peer, limit) ({increase('runtimeproxy_h2_peer_limit_exceeded_total', JOBS)})",
                "{{job}} {{peer}} {{limit}}",
            ),
        ),
    ),
)

ROWS = (OVERVIEW, CRI, HOOKS, PLUGINS, RECONCILE, NRI, POLICY, PROCESSES)


def _target(query: Query, ref: str) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(query.expr).ref_id(ref).datasource(DATASOURCE)
    if query.table:
        return target.instant().format(PromQueryFormat.TABLE)
    return target.range().legend_format(query.legend or "__auto")


PanelBuilder = stat.Panel | table.Panel | timeseries.Panel
BUILDERS: dict[str, type[PanelBuilder]] = {"stat": stat.Panel, "table": table.Panel, "timeseries": timeseries.Panel}


def _panel(spec: Panel) -> PanelBuilder:
    builder = BUILDERS[spec.kind]()
    builder.title(spec.title).description(spec.description).datasource(DATASOURCE)
    builder.unit(spec.unit).span(spec.width).height(spec.height)
    for index, query in enumerate(spec.queries):
        builder.with_target(_target(query, chr(ord("A") + index)))
    return builder


def _variables() -> list[Builder[model.VariableModel]]:
    source = dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    node = (
        dashboard.QueryVariable("node")
        .label("Node")
        .description("Hosts of the runtime-proxy and runtime-hooks scrape targets (instance without its port).")
        .datasource(DATASOURCE)
        .query(f"label_values(up{{{JOBS}}}, instance)")
        .regex(NODE_REGEX)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text=["All"], value=["$__all"]))
    )
    return [source, node]


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    board = (
        dashboard.Dashboard("runtimeproxy: CRI proxy and runtime hooks")
        .uid(UID)
        .tags(["runtimeproxy", "kubernetes", "cri"])
        .description("runtime-proxy and runtime-hooks on the selected nodes (docs/dashboard.md).")
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
        .variables(_variables())
    )
    for row in ROWS:
        board.with_row(dashboard.Row(row.title))
        for spec in row.panels:
            board.with_panel(_panel(spec))
    model: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return model


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
