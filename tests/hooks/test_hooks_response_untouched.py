"""HookResponse.untouched(): the runner's cheap check that a handler changed nothing. It must be
exact: untouched means no problems and nothing to merge, and any change at all (even a value the
proxy would refuse, or one equal to zero in another type) makes it touched. And the handler's
logger, bound only when used, still says which plugin and call a line is from."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.changes import EnvChanges, HookResponse, ResourceChanges
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.sdk import ContainerInfo, Plugin, PodInfo
from runtimeproxy.hooks.views import HugepageLimit
from structlog.testing import capture_logs

from runtimeproxy.hookapi import resource_fields
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 0.0, False, True, "", "0", None, b"", [], {}]),
    st.text(max_size=5),
)


def _scalar(name: str) -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.just(f"resources.{name}"), VALUES)


CHANGES = st.one_of(
    st.sampled_from([*resource_fields.SCALARS]).flatmap(_scalar),
    st.tuples(st.just("resources.hugepage_limits"), st.sampled_from([[HugepageLimit("2MB", 1)], ["x"], (), None])),
    st.tuples(st.just("resources.unified"), st.sampled_from([{"memory.high": "1"}, {1: 2}, [], None])),
    st.tuples(st.sampled_from(["annotations", "labels"]), st.sampled_from([{"a": "b"}, {"a": 1}, {}, None, []])),
    st.tuples(st.just("env"), st.sampled_from([("A", "1"), ("", "x"), ("B", "\0")])),
    st.tuples(st.just("cgroup_parent"), st.sampled_from(["", "/x", None, 0, b"", "a\0"])),
    st.tuples(st.sampled_from(["replace resources", "replace env", "replace annotations", "new attribute"]), VALUES),
)


def apply(response: HookResponse, change: tuple[str, Any]) -> None:
    where, value = change
    if where.startswith("resources."):
        setattr(response.resources, where.removeprefix("resources."), value)
    elif where in ("annotations", "labels", "cgroup_parent"):
        setattr(response, where, value)
    elif where == "env":
        response.env.set(*value)
    elif where == "replace resources":
        response.resources = ResourceChanges()
    elif where == "replace env":
        response.env = EnvChanges()
    elif where == "replace annotations":
        response.annotations = {}
    else:
        response.resources.extra = value  # type: ignore[attr-defined]


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(HookKind), changes=st.lists(CHANGES, max_size=3))
def test_untouched_means_no_problems_and_nothing_to_merge(kind: HookKind, changes: list[tuple[str, Any]]) -> None:
    response = HookResponse(kind)
    for change in changes:
        apply(response, change)
    if not response.untouched():
        return
    assert response.problems() == []
    assert list(response.set_fields()) == []
    merged = HookResponse(kind)
    merged.annotations["kept"] = "yes"
    merged.merge(response)
    assert merged.annotations == {"kept": "yes"} and merged.resources == ResourceChanges()


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(HookKind), change=CHANGES)
def test_any_change_is_seen(kind: HookKind, change: tuple[str, Any]) -> None:
    response = HookResponse(kind)
    apply(response, change)
    where, value = change
    # Only a value equal to the one made, of its very type, leaves it untouched; a field replaced by
    # another object (even an empty one) counts as touched: the check is by identity, never too lax.
    unchanged = (where.startswith("resources.") and value == (empty := getattr(ResourceChanges(), where[10:]))) and (
        type(value) is type(empty)
    )
    unchanged = unchanged or (where == "cgroup_parent" and type(value) is str and value == "")
    assert response.untouched() is bool(unchanged)


def test_a_new_response_is_untouched() -> None:
    assert HookResponse(HookKind.POD).untouched() and HookResponse(HookKind.CONTAINER).untouched()


async def test_a_plugins_log_lines_name_the_plugin_and_the_call_bound_on_first_use() -> None:
    plugin = Plugin("talker")

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
    async def talk(*, log: Any, **kwargs: Any) -> None:
        log.info("said once")
        log.bind(extra="x").warning("said with more")

    quiet = Plugin("quiet")

    @quiet.on(HookPoint.PRE_CREATE_CONTAINER)
    async def silent(**kwargs: Any) -> None:
        pass

    pod = PodInfo(name="web", namespace="default", uid="u-1", cgroup_parent="/kubepods/burstable/podu-1")
    runner = PluginRunner([plugin, quiet], registry=CollectorRegistry())
    with capture_logs() as lines:
        result = await runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=pod, container=ContainerInfo(name="app"))
    assert result.applied == ["quiet", "talker"]
    said = [line for line in lines if line["event"].startswith("said")]
    call = {"plugin": "talker", "hook": "PreCreateContainer", "pod": "default/web", "container": "app"}
    assert [{key: line.get(key) for key in call} for line in said] == [call, call]
    assert said[1]["extra"] == "x"
