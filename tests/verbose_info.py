"""What containerd's verbose PodSandboxStatus / ContainerStatus ``info`` holds, for fake runtimes."""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict


def go_json(message: Any) -> Any:
    """The config as containerd's verbose info holds it (env values as text, not base64)."""
    data = MessageToDict(message, preserving_proto_field_name=True)
    if "envs" in data:
        data["envs"] = [{"key": kv.key, "value": kv.value.decode()} for kv in message.envs]
    return data
