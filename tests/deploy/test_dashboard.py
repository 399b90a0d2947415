"""The Grafana dashboard (deploy/grafana/runtimeproxy.json): the committed file is what its
generator writes, and every panel is bound to the data source and node variables.

Whether the queries find the daemons' metrics is tests/deploy/test_prometheus_live.py's part.
"""

from __future__ import annotations

import re

from dashboard_json import committed, expressions, generator, panels, variables

DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}


def test_committed_json_is_what_the_generator_writes() -> None:
    made = generator()
    assert made.render() == made.OUTPUT.read_text(), (
        "deploy/grafana/runtimeproxy.json is stale: run `python deploy/grafana/dashboard.py`"
    )


def test_variables_are_the_data_source_and_the_nodes() -> None:
    found = variables(committed())
    assert found["datasource"]["type"] == "datasource"
    assert found["datasource"]["query"] == "prometheus"
    node = found["node"]
    assert node["type"] == "query"
    assert node["datasource"] == DATASOURCE_REF
    assert node["multi"] is True and node["includeAll"] is True
    assert "instance" in node["query"] and "runtime-proxy" in node["query"] and "runtime-hooks" in node["query"]


def test_node_regex_keeps_the_host_of_an_instance() -> None:
    """The variable's regex (Grafana uses its first group) turns a target into its node."""
    regex = re.compile(variables(committed())["node"]["regex"].strip("/"))
    for instance, host in [
        ("10.0.0.7:9316", "10.0.0.7"),
        ("node-a:9317", "node-a"),
        ("node-a", "node-a"),
        ("[fd00::7]:9316", "[fd00::7]"),
    ]:
        match = regex.match(instance)
        assert match is not None and match.group(1) == host, instance


def test_every_panel_queries_the_data_source_variable() -> None:
    board = committed()
    found = list(panels(board))
    assert len(found) >= 20
    for panel in found:
        assert panel["datasource"] == DATASOURCE_REF, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE_REF, panel["title"]


def test_every_query_is_filtered_by_node() -> None:
    for title, expr in expressions(committed()):
        # each selector of the expression: every one carries the node matcher
        selectors = re.findall(r"\{[^}]*\}", expr)
        assert selectors, (title, expr)
        for selector in selectors:
            assert 'instance=~"$node(:[0-9]+)?"' in selector, (title, expr)
