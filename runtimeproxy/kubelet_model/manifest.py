"""Load and validate a Pod manifest for ``runtime-proxy play`` and ``runtime-hooks explain``.

The loader plays the API server's part for one Pod: it reads YAML, checks
the fields that ``play`` relies on, fills ``metadata.namespace`` and
``metadata.uid`` when they are missing, and turns the result into a
``kubernetes.client.V1Pod`` without talking to any cluster.

The input may also hold a DaemonSet instead of the Pod (the pod its controller would
create on this node is played: :mod:`runtimeproxy.kubelet_model.workloads`) and the
ConfigMaps that the pod's ``configMap`` volumes and ``configMapKeyRef`` variables name
(:func:`load_pod_input` returns them with the pod).

Every problem is reported as a :class:`ManifestError` whose message names the
file and the field path, for example::

    pod.yaml: spec.containers[1].resources.limits.cpu: invalid quantity "abc"

About the uid: a Pod created through the API server gets a random uuid4.
``play`` must find the same sandbox again from the manifest alone (for
``--delete``), so when ``metadata.uid`` is missing the uid is derived from
the namespace and name instead: the first 16 bytes of
``sha256("runtimeproxy-play:<namespace>/<name>")`` with the uuid version
(4) and variant bits set.  It looks like a uuid4, but the same manifest always
gets the same uid.  Set ``metadata.uid`` yourself to run two copies of one
Pod side by side.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml
from kubernetes.client import ApiClient, V1Pod
from kubernetes.utils import parse_quantity as _untyped_parse_quantity

from runtimeproxy.kubelet_model.workloads import POD_TEMPLATE_KINDS, daemonset_pod

__all__ = [
    "DEFAULT_NAMESPACE",
    "ENV_FIELD_PATHS",
    "HOST_PATH_TYPES",
    "ConfigMap",
    "ManifestError",
    "PodInput",
    "derive_pod_uid",
    "load_pod",
    "load_pod_input",
    "parse_config_maps_text",
    "parse_input_text",
    "parse_pod",
    "parse_pod_text",
    "parse_quantity_value",
]

DEFAULT_NAMESPACE = "default"

# Grammar of a Kubernetes resource.Quantity: a signed decimal number followed
# by an optional binary-SI, decimal-SI or decimal-exponent suffix.
_QUANTITY_RE = re.compile(
    r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
# RFC 1123 label (container names, namespaces) and subdomain (pod names).
_DNS_LABEL_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME_RE = re.compile(r"^[^=\x00]+$")
# A ConfigMap key (validation.IsConfigMapKey) and a pod uid as it may appear in a path.
_CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_UID_RE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")

_parse_quantity: Callable[[str], object] = _untyped_parse_quantity
_CONTAINER_LISTS = ("initContainers", "containers")
_SUPPORTED_VOLUME_SOURCES = ("hostPath", "configMap", "emptyDir")
_OBJECT_KINDS = ("Pod", *POD_TEMPLATE_KINDS, "ConfigMap")
HOST_PATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                   "BlockDevice")
_PROPAGATIONS = ("None", "HostToContainer", "Bidirectional")
_SECCOMP_TYPES = ("RuntimeDefault", "Localhost", "Unconfined")
# Downward API fields kubelet resolves for env (podIP needs hostNetwork here: see pod_plan).
ENV_FIELD_PATHS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                   "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
_ENV_FIELD_MAPS = ("metadata.labels", "metadata.annotations")


class ManifestError(ValueError):
    """A manifest that ``play`` cannot use.

    ``source`` names the file (or ``<stdin>``), ``field`` is the dotted field
    path inside the Pod ("" when the problem is the file as a whole) and
    ``reason`` says what is wrong.  ``str()`` gives ``source: field: reason``.
    """

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source = source
        self.field = field
        self.reason = reason
        text = f"{source}: {field}: {reason}" if field else f"{source}: {reason}"
        super().__init__(text)


@dataclass(frozen=True)
class ConfigMap:
    """One ConfigMap of the input: its keys with their bytes (``data`` encoded as UTF-8,
    ``binaryData`` decoded from base64)."""

    name: str
    namespace: str
    files: Mapping[str, bytes]


@dataclass(frozen=True)
class PodInput:
    """What one input file gives ``play``: the pod, the ConfigMaps beside it (by name, in the
    pod's namespace) and, for a workload, what the pod was derived from (``DaemonSet ns/name``)."""

    pod: V1Pod
    config_maps: Mapping[str, ConfigMap] = field(default_factory=dict)
    derived_from: str = ""


def derive_pod_uid(namespace: str, name: str) -> str:
    """The uid used for a Pod whose manifest has none (see the module doc)."""
    digest = hashlib.sha256(f"runtimeproxy-play:{namespace}/{name}".encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


# Not hooks/extended_resources.quantity_value: that one is Go's ParseQuantity + Value() for
# Koordinator's annotation ("+" and "." are 0, values rounded up to whole units, negatives
# kept); kubelet's arithmetic here needs the exact value ("100m" cpu is 0.1) and a manifest
# gets what the API server's validation accepts, no negative quantity.
def parse_quantity_value(value: object) -> Decimal:
    """Parse one resource quantity strictly, raising ``ValueError`` if it is not one.

    ``kubernetes.utils.parse_quantity`` is lenient (it takes ``True``,
    ``"inf"``, ``"1_000"``...), so the Kubernetes quantity grammar is checked
    first.  Negative quantities are rejected as well: no resource may be
    negative.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"invalid quantity {_show(value)}")
    text = str(value) if not isinstance(value, float) else repr(value)
    if not _QUANTITY_RE.match(text):
        raise ValueError(f"invalid quantity {_show(value)}")
    try:
        quantity = _parse_quantity(text)
    except ValueError as exc:
        raise ValueError(f"invalid quantity {_show(value)}") from exc
    if not isinstance(quantity, Decimal) or not quantity.is_finite():
        raise ValueError(f"invalid quantity {_show(value)}")
    if quantity < 0:
        raise ValueError(f"quantity must not be negative, got {_show(value)}")
    return quantity


def load_pod(path: str | os.PathLike[str]) -> V1Pod:
    """Read ``path`` and return the one Pod it holds (or its DaemonSet's), validated and defaulted."""
    return load_pod_input(path).pod


def load_pod_input(path: str | os.PathLike[str], node_name: str | None = None) -> PodInput:
    """Read ``path``: the one Pod (or DaemonSet) it holds and its ConfigMaps (see :class:`PodInput`).

    ``node_name`` (default: this host's name) is the node a DaemonSet's pod is made for."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ManifestError(source, "", f"cannot read manifest: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(source, "", f"manifest is not UTF-8 text: {exc}") from exc
    return parse_input_text(text, source, node_name)


def parse_pod_text(text: str, source: str = "<manifest>") -> V1Pod:
    """Parse YAML text holding one Pod (a single document, a List or a stream)."""
    return parse_input_text(text, source).pod


def parse_input_text(text: str, source: str = "<manifest>", node_name: str | None = None) -> PodInput:
    """Parse YAML text holding one Pod or DaemonSet and any ConfigMaps (one document, a List
    or a stream)."""
    pods, config_maps = _split_objects(text, source)
    if len(pods) != 1:
        names = ", ".join(f"{obj.get('kind')} {_show(_name_of(obj))}" for _, _, obj in pods)
        raise ManifestError(
            source, "", f"expected exactly one Pod or DaemonSet, found {len(pods)}" + (f": {names}" if names else "")
        )
    label, prefix, obj = pods[0]
    derived_from = ""
    if obj.get("kind") != "Pod":
        obj, prefix, derived_from = _workload_pod(obj, label, prefix, node_name)
    pod = _parse_pod(obj, label, prefix)
    maps = {}
    for map_label, map_prefix, map_obj in config_maps:
        config_map = _parse_config_map(map_obj, map_label, map_prefix)
        if config_map.namespace == _metadata(pod).namespace:
            maps[config_map.name] = config_map
    return PodInput(pod=pod, config_maps=maps, derived_from=derived_from)


def parse_config_maps_text(text: str, source: str = "<manifest>") -> dict[str, ConfigMap]:
    """The ConfigMaps of YAML text that holds nothing else, by name."""
    pods, config_maps = _split_objects(text, source)
    if pods:
        label, prefix, obj = pods[0]
        raise ManifestError(label, prefix + "kind", f"expected only ConfigMaps, got {_show(obj.get('kind'))}")
    parsed = [_parse_config_map(obj, label, prefix) for label, prefix, obj in config_maps]
    return {config_map.name: config_map for config_map in parsed}


_Found = list[tuple[str, str, Any]]  # (source label, field prefix, object)


def _split_objects(text: str, source: str) -> tuple[_Found, _Found]:
    """(pods and workloads, ConfigMaps) of YAML text: one document, a List or a stream."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(source, "", f"invalid YAML: {_one_line(str(exc))}") from exc
    if not documents:
        raise ManifestError(source, "", "no Pod found: the file is empty")
    pods: _Found = []
    config_maps: _Found = []
    for number, document in enumerate(documents, start=1):
        label = source if len(documents) == 1 else f"{source} (document {number})"
        for prefix, obj in _objects_in(document, label):
            (config_maps if obj.get("kind") == "ConfigMap" else pods).append((label, prefix, obj))
    return pods, config_maps


def _name_of(obj: Mapping[str, Any]) -> object:
    metadata = obj.get("metadata")
    return metadata.get("name") if isinstance(metadata, Mapping) else None


def _metadata(pod: V1Pod) -> Any:
    return pod.metadata


def _workload_pod(obj: Mapping[str, Any], label: str, prefix: str, node_name: str | None) -> tuple[Any, str, str]:
    """(the pod its controller makes, the field prefix of its template, what it came from)."""
    check = _Checker(label, prefix)
    kind = str(obj.get("kind"))
    if obj.get("apiVersion") != POD_TEMPLATE_KINDS[kind]:
        expected = _show(POD_TEMPLATE_KINDS[kind])
        raise check.fail("apiVersion", f"expected {expected}, got {_show(obj.get('apiVersion'))}")
    metadata = check.mapping(obj.get("metadata"), "metadata", required=True)
    name = check.string(metadata.get("name"), "metadata.name", required=True)
    namespace = check.string(metadata.get("namespace"), "metadata.namespace") or DEFAULT_NAMESPACE
    spec = check.mapping(obj.get("spec"), "spec", required=True)
    template = check.mapping(spec.get("template"), "spec.template", required=True)
    check.mapping(template.get("metadata"), "spec.template.metadata")
    check.string_map((template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
    check.mapping(template.get("spec"), "spec.template.spec", required=True)
    node = node_name or socket.gethostname()
    pod = daemonset_pod(obj, node, namespace)
    return pod, prefix + "spec.template.", f"{kind} {namespace}/{name}"


def _parse_config_map(obj: Mapping[str, Any], label: str, prefix: str) -> ConfigMap:
    check = _Checker(label, prefix)
    if obj.get("apiVersion") != "v1":
        raise check.fail("apiVersion", f'expected "v1", got {_show(obj.get("apiVersion"))}')
    metadata = check.mapping(obj.get("metadata"), "metadata", required=True)
    name = check.string(metadata.get("name"), "metadata.name", required=True)
    assert name is not None
    namespace = check.string(metadata.get("namespace"), "metadata.namespace") or DEFAULT_NAMESPACE
    files: dict[str, bytes] = {}
    for key, value in check.mapping(obj.get("data"), "data").items():
        _check_config_key(check, f"data.{key}", key)
        text = check.string(value, f"data.{key}")
        files[key] = (text or "").encode()
    for key, value in check.mapping(obj.get("binaryData"), "binaryData").items():
        _check_config_key(check, f"binaryData.{key}", key)
        if key in files:
            raise check.fail(f"binaryData.{key}", "duplicate of a key in data")
        text = check.string(value, f"binaryData.{key}") or ""
        try:
            files[key] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise check.fail(f"binaryData.{key}", f"not base64: {exc}") from None
    return ConfigMap(name=name, namespace=namespace, files=files)


def _check_config_key(check: _Checker, field_path: str, key: str) -> None:
    if len(key) > 253 or not _CONFIG_KEY_RE.match(key) or key in (".", ".."):
        raise check.fail(field_path, f"{_show(key)} is not a valid ConfigMap key")


def parse_pod(data: object, source: str = "<manifest>") -> V1Pod:
    """Validate one decoded Pod object (a mapping) and return it as a ``V1Pod``."""
    return _parse_pod(data, source, "")


# --------------------------------------------------------------------------
# internals


def _is_list(document: object) -> bool:
    return (
        isinstance(document, Mapping)
        and isinstance(document.get("kind"), str)
        and document["kind"].endswith("List")
        and "items" in document
    )


def _objects_in(document: object, label: str) -> Iterator[tuple[str, Any]]:
    """Yield (field prefix, object) for each object in a document, checking kinds."""
    if not isinstance(document, Mapping):
        raise ManifestError(label, "", f"expected a mapping, got {_type_name(document)}")
    if _is_list(document):
        items = document["items"]
        if not isinstance(items, list):
            raise ManifestError(label, "items", f"expected a list, got {_type_name(items)}")
        for index, item in enumerate(items):
            prefix = f"items[{index}]"
            if not isinstance(item, Mapping):
                raise ManifestError(label, prefix, f"expected a mapping, got {_type_name(item)}")
            _check_kind(item, label, f"{prefix}.kind")
            yield prefix + ".", item
        return
    _check_kind(document, label, "kind")
    yield "", document


def _check_kind(obj: Mapping[str, Any], label: str, field_path: str) -> None:
    if obj.get("kind") not in _OBJECT_KINDS:
        raise ManifestError(
            label,
            field_path,
            f"only {', '.join(_OBJECT_KINDS[:-1])} and {_OBJECT_KINDS[-1]} objects are supported, "
            f"got {_show(obj.get('kind'))}",
        )


class _Checker:
    """Walks the raw Pod mapping; every error carries its field path."""

    def __init__(self, source: str, prefix: str) -> None:
        self.source = source
        self.prefix = prefix

    def fail(self, field: str, reason: str) -> ManifestError:
        return ManifestError(self.source, (self.prefix + field).rstrip("."), reason)

    def mapping(self, value: object, field: str, *, required: bool = False) -> Mapping[str, Any]:
        if value is None:
            if required:
                raise self.fail(field, "required field is missing")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(field, f"expected a mapping, got {_type_name(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(field, f"keys must be strings, got {_show(key)}")
        return value

    def sequence(self, value: object, field: str) -> Sequence[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(field, f"expected a list, got {_type_name(value)}")
        return value

    def string(self, value: object, field: str, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                raise self.fail(field, "required field is missing")
            return None
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {_type_name(value)} {_show(value)}")
        if required and not value:
            raise self.fail(field, "must not be empty")
        return value

    def string_map(self, value: object, field: str) -> None:
        for key, item in self.mapping(value, field).items():
            self.string(item, f"{field}.{key}")

    def integer(self, value: object, field: str) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.fail(field, f"expected an integer, got {_type_name(value)} {_show(value)}")

    def boolean(self, value: object, field: str) -> None:
        if value is not None and not isinstance(value, bool):
            raise self.fail(field, f"expected true or false, got {_show(value)}")

    def resource_list(self, value: object, field: str) -> dict[str, Decimal]:
        parsed: dict[str, Decimal] = {}
        for name, quantity in self.mapping(value, field).items():
            try:
                parsed[name] = parse_quantity_value(quantity)
            except ValueError as exc:
                raise self.fail(f"{field}.{name}", str(exc)) from None
        return parsed

    def resources(self, value: object, field: str) -> None:
        body = self.mapping(value, field)
        limits = self.resource_list(body.get("limits"), f"{field}.limits")
        requests = self.resource_list(body.get("requests"), f"{field}.requests")
        for name, request in requests.items():
            limit = limits.get(name)
            if limit is not None and request > limit:
                raise self.fail(
                    f"{field}.requests.{name}",
                    f"must be less than or equal to the limit "
                    f"({_show(body['requests'][name])} > {_show(body['limits'][name])})",
                )


def _parse_pod(data: object, source: str, prefix: str) -> V1Pod:
    check = _Checker(source, prefix)
    pod = dict(check.mapping(data, "", required=True))

    api_version = pod.get("apiVersion")
    if api_version != "v1":
        raise check.fail("apiVersion", f'expected "v1", got {_show(api_version)}')
    kind = pod.get("kind")
    if kind != "Pod":
        raise check.fail("kind", f'expected "Pod", got {_show(kind)}')

    metadata = dict(check.mapping(pod.get("metadata"), "metadata"))
    name = check.string(metadata.get("name"), "metadata.name", required=True)
    assert name is not None
    if len(name) > 253 or not _DNS_SUBDOMAIN_RE.match(name):
        raise check.fail(
            "metadata.name",
            f"{_show(name)} is not a valid name (lowercase RFC 1123 subdomain, at most 253 characters)",
        )
    namespace = check.string(metadata.get("namespace"), "metadata.namespace") or DEFAULT_NAMESPACE
    if len(namespace) > 63 or not _DNS_LABEL_RE.match(namespace):
        raise check.fail(
            "metadata.namespace",
            f"{_show(namespace)} is not a valid namespace (lowercase RFC 1123 label, at most 63 characters)",
        )
    uid = check.string(metadata.get("uid"), "metadata.uid")
    if uid is not None and not _UID_RE.match(uid):
        # kubelet makes directories named after it (the pod's volumes).
        raise check.fail("metadata.uid", f"{_show(uid)} is not a valid uid (letters, digits, '-', '_', '.')")
    check.string_map(metadata.get("labels"), "metadata.labels")
    check.string_map(metadata.get("annotations"), "metadata.annotations")
    metadata["namespace"] = namespace
    metadata["uid"] = uid or derive_pod_uid(namespace, name)
    pod["metadata"] = metadata

    spec = check.mapping(pod.get("spec"), "spec", required=True)
    _check_spec(check, spec)

    pod = _normalize_quantities(pod)
    try:
        client: Any = ApiClient()
        result = client._ApiClient__deserialize(pod, "V1Pod")
    except (TypeError, ValueError, AttributeError) as exc:
        # Fields this module does not check one by one (affinity, probes...).
        raise ManifestError(source, prefix.rstrip("."), f"cannot decode Pod: {_one_line(str(exc))}") from exc
    if not isinstance(result, V1Pod):
        raise ManifestError(source, prefix.rstrip("."), "cannot decode Pod")
    return result


def _normalize_quantities(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of the (validated) pod whose quantities are all strings.

    YAML reads ``cpu: 1`` as a number; the API (and the client's models)
    want the quantity's text.
    """
    pod = copy.deepcopy(pod)
    spec = pod["spec"]

    def fix(resource_list: Any) -> None:
        if isinstance(resource_list, dict):
            for name, value in resource_list.items():
                if isinstance(value, float):
                    resource_list[name] = repr(value)
                elif isinstance(value, int):
                    resource_list[name] = str(value)

    def fix_requirements(requirements: Any) -> None:
        if isinstance(requirements, dict):
            fix(requirements.get("limits"))
            fix(requirements.get("requests"))

    fix(spec.get("overhead"))
    fix_requirements(spec.get("resources"))
    for list_name in _CONTAINER_LISTS:
        for container in spec.get(list_name) or []:
            fix_requirements(container.get("resources"))
    return pod


def _check_spec(check: _Checker, spec: Mapping[str, Any]) -> None:
    containers = check.sequence(spec.get("containers"), "spec.containers")
    if not containers:
        raise check.fail("spec.containers", "at least one container is required")
    for unsupported in ("ephemeralContainers",):
        if spec.get(unsupported):
            raise check.fail(f"spec.{unsupported}", "not supported by play")

    volumes: set[str] = set()
    for index, volume in enumerate(check.sequence(spec.get("volumes"), "spec.volumes")):
        field = f"spec.volumes[{index}]"
        body = check.mapping(volume, field)
        volume_name = check.string(body.get("name"), f"{field}.name", required=True)
        assert volume_name is not None
        if volume_name in volumes:
            raise check.fail(f"{field}.name", f"duplicate volume name {_show(volume_name)}")
        volumes.add(volume_name)
        sources = [key for key in body if key != "name"]
        if len(sources) != 1 or sources[0] not in _SUPPORTED_VOLUME_SOURCES:
            raise check.fail(
                field,
                f"volume source {', '.join(sources) or '(none)'} is not supported by play "
                f"(supported: {', '.join(_SUPPORTED_VOLUME_SOURCES)})",
            )
        _VOLUME_CHECKS[sources[0]](check, check.mapping(body[sources[0]], f"{field}.{sources[0]}"),
                                   f"{field}.{sources[0]}")

    for flag in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
        check.boolean(spec.get(flag), f"spec.{flag}")
    check.integer(spec.get("terminationGracePeriodSeconds"), "spec.terminationGracePeriodSeconds")
    check.string(spec.get("hostname"), "spec.hostname")
    if spec.get("resources") is not None:
        check.resources(spec.get("resources"), "spec.resources")
    if spec.get("overhead") is not None:
        check.resource_list(spec.get("overhead"), "spec.overhead")
    pod_sc = check.mapping(spec.get("securityContext"), "spec.securityContext")
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        check.integer(pod_sc.get(key), f"spec.securityContext.{key}")
    _check_seccomp(check, pod_sc.get("seccompProfile"), "spec.securityContext.seccompProfile")
    for index, group in enumerate(
        check.sequence(pod_sc.get("supplementalGroups"), "spec.securityContext.supplementalGroups")
    ):
        check.integer(group, f"spec.securityContext.supplementalGroups[{index}]")

    names: set[str] = set()
    for list_name in _CONTAINER_LISTS:
        for index, container in enumerate(check.sequence(spec.get(list_name), f"spec.{list_name}")):
            field = f"spec.{list_name}[{index}]"
            _check_container(check, check.mapping(container, field, required=True), field, names, volumes,
                             host_network=bool(spec.get("hostNetwork")))


def _check_host_path(check: _Checker, body: Mapping[str, Any], field: str) -> None:
    path = check.string(body.get("path"), f"{field}.path", required=True)
    if path is not None and not path.startswith("/"):
        raise check.fail(f"{field}.path", f"must be an absolute path, got {_show(path)}")
    kind = check.string(body.get("type"), f"{field}.type")
    if kind is not None and kind not in HOST_PATH_TYPES:
        known = ", ".join(HOST_PATH_TYPES[1:])
        raise check.fail(f"{field}.type", f"unknown hostPath type {_show(kind)} (known: {known})")


def _check_config_map_volume(check: _Checker, body: Mapping[str, Any], field: str) -> None:
    check.string(body.get("name"), f"{field}.name", required=True)
    check.boolean(body.get("optional"), f"{field}.optional")
    _check_mode(check, body.get("defaultMode"), f"{field}.defaultMode")
    for index, item in enumerate(check.sequence(body.get("items"), f"{field}.items")):
        item_field = f"{field}.items[{index}]"
        item_body = check.mapping(item, item_field, required=True)
        check.string(item_body.get("key"), f"{item_field}.key", required=True)
        path = check.string(item_body.get("path"), f"{item_field}.path", required=True)
        assert path is not None
        if path.startswith("/") or ".." in path.split("/") or path.startswith(".."):
            raise check.fail(f"{item_field}.path", f"must be a relative path without '..', got {_show(path)}")
        _check_mode(check, item_body.get("mode"), f"{item_field}.mode")


def _check_mode(check: _Checker, value: object, field: str) -> None:
    check.integer(value, field)
    if isinstance(value, int) and not 0 <= value <= 0o777:
        raise check.fail(field, f"must be a file mode between 0 and 0777, got {value}")


def _check_empty_dir(check: _Checker, body: Mapping[str, Any], field: str) -> None:
    medium = check.string(body.get("medium"), f"{field}.medium")
    if medium not in (None, "", "Memory"):
        raise check.fail(f"{field}.medium", f"medium {_show(medium)} is not supported by play (\"\" or Memory)")
    if body.get("sizeLimit") is not None:
        try:
            parse_quantity_value(body["sizeLimit"])
        except ValueError as exc:
            raise check.fail(f"{field}.sizeLimit", str(exc)) from None


_VOLUME_CHECKS: dict[str, Callable[[_Checker, Mapping[str, Any], str], None]] = {
    "hostPath": _check_host_path,
    "configMap": _check_config_map_volume,
    "emptyDir": _check_empty_dir,
}


def _check_seccomp(check: _Checker, value: object, field: str) -> None:
    body = check.mapping(value, field)
    kind = check.string(body.get("type"), f"{field}.type", required=bool(body))
    if kind is not None and kind not in _SECCOMP_TYPES:
        raise check.fail(f"{field}.type", f"unknown seccomp profile type {_show(kind)}")
    if kind == "Localhost":
        check.string(body.get("localhostProfile"), f"{field}.localhostProfile", required=True)


def _check_env_source(check: _Checker, source: Mapping[str, Any], field: str, host_network: bool) -> None:
    """valueFrom: the downward API fields kubelet resolves, and keys of the input's ConfigMaps."""
    kinds = list(source)
    if kinds == ["fieldRef"]:
        ref = check.mapping(source["fieldRef"], f"{field}.fieldRef", required=True)
        path = check.string(ref.get("fieldPath"), f"{field}.fieldRef.fieldPath", required=True)
        assert path is not None
        if path.startswith("status.podIP") and not host_network:
            raise check.fail(f"{field}.fieldRef.fieldPath",
                             "status.podIP is known only with hostNetwork here (play runs no CNI IPAM lookup)")
        if path not in ENV_FIELD_PATHS and not any(
            path.startswith(f"{prefix}['") and path.endswith("']") for prefix in _ENV_FIELD_MAPS
        ):
            raise check.fail(f"{field}.fieldRef.fieldPath", f"field {_show(path)} is not supported by play "
                             f"(supported: {', '.join(ENV_FIELD_PATHS)}, metadata.labels['...'], "
                             "metadata.annotations['...'])")
        return
    if kinds == ["configMapKeyRef"]:
        ref = check.mapping(source["configMapKeyRef"], f"{field}.configMapKeyRef", required=True)
        check.string(ref.get("name"), f"{field}.configMapKeyRef.name", required=True)
        check.string(ref.get("key"), f"{field}.configMapKeyRef.key", required=True)
        check.boolean(ref.get("optional"), f"{field}.configMapKeyRef.optional")
        return
    raise check.fail(field, f"{', '.join(kinds) or '(empty)'} is not supported by play (supported: fieldRef, "
                     "configMapKeyRef from a ConfigMap in the input; there is no API server for the rest)")


def _check_container(
    check: _Checker, container: Mapping[str, Any], field: str, names: set[str], volumes: set[str],
    *, host_network: bool = False,
) -> None:
    name = check.string(container.get("name"), f"{field}.name", required=True)
    assert name is not None
    if len(name) > 63 or not _DNS_LABEL_RE.match(name):
        raise check.fail(
            f"{field}.name",
            f"{_show(name)} is not a valid container name (lowercase RFC 1123 label, at most 63 characters)",
        )
    if name in names:
        raise check.fail(f"{field}.name", f"duplicate container name {_show(name)}")
    names.add(name)
    check.string(container.get("image"), f"{field}.image", required=True)
    for key in ("command", "args"):
        for index, item in enumerate(check.sequence(container.get(key), f"{field}.{key}")):
            check.string(item, f"{field}.{key}[{index}]")
    check.string(container.get("workingDir"), f"{field}.workingDir")
    for flag in ("stdin", "stdinOnce", "tty"):
        check.boolean(container.get(flag), f"{field}.{flag}")
    if container.get("envFrom"):
        raise check.fail(f"{field}.envFrom", "not supported by play (no ConfigMaps or Secrets here)")
    for index, env in enumerate(check.sequence(container.get("env"), f"{field}.env")):
        env_field = f"{field}.env[{index}]"
        body = check.mapping(env, env_field, required=True)
        env_name = check.string(body.get("name"), f"{env_field}.name", required=True)
        if env_name is not None and not _ENV_NAME_RE.match(env_name):
            raise check.fail(f"{env_field}.name", f"invalid environment variable name {_show(env_name)}")
        if body.get("valueFrom") is not None:
            source = check.mapping(body["valueFrom"], f"{env_field}.valueFrom")
            _check_env_source(check, source, f"{env_field}.valueFrom", host_network)
        value = body.get("value")
        if value is not None and not isinstance(value, str):
            raise check.fail(
                f"{env_field}.value",
                f"expected a string, got {_type_name(value)} {_show(value)} (quote it in YAML)",
            )
    check.resources(container.get("resources"), f"{field}.resources")
    for index, mount in enumerate(check.sequence(container.get("volumeMounts"), f"{field}.volumeMounts")):
        mount_field = f"{field}.volumeMounts[{index}]"
        body = check.mapping(mount, mount_field, required=True)
        volume = check.string(body.get("name"), f"{mount_field}.name", required=True)
        if volume not in volumes:
            raise check.fail(f"{mount_field}.name", f"no volume named {_show(volume)} in spec.volumes")
        path = check.string(body.get("mountPath"), f"{mount_field}.mountPath", required=True)
        if path is not None and not path.startswith("/"):
            raise check.fail(f"{mount_field}.mountPath", f"must be an absolute path, got {_show(path)}")
        check.boolean(body.get("readOnly"), f"{mount_field}.readOnly")
        propagation = check.string(body.get("mountPropagation"), f"{mount_field}.mountPropagation")
        if propagation is not None and propagation not in _PROPAGATIONS:
            raise check.fail(f"{mount_field}.mountPropagation", f"unknown propagation {_show(propagation)} "
                             f"(known: {', '.join(_PROPAGATIONS)})")
        sub_path = check.string(body.get("subPath"), f"{mount_field}.subPath")
        if sub_path and (sub_path.startswith("/") or ".." in sub_path.split("/")):
            raise check.fail(f"{mount_field}.subPath", f"must be a relative path without '..', got {_show(sub_path)}")
    for index, port in enumerate(check.sequence(container.get("ports"), f"{field}.ports")):
        port_field = f"{field}.ports[{index}]"
        body = check.mapping(port, port_field, required=True)
        check.integer(body.get("containerPort"), f"{port_field}.containerPort")
        check.integer(body.get("hostPort"), f"{port_field}.hostPort")
    sc = check.mapping(container.get("securityContext"), f"{field}.securityContext")
    for key in ("runAsUser", "runAsGroup"):
        check.integer(sc.get(key), f"{field}.securityContext.{key}")
    for key in ("privileged", "readOnlyRootFilesystem", "allowPrivilegeEscalation", "runAsNonRoot"):
        check.boolean(sc.get(key), f"{field}.securityContext.{key}")
    capabilities = check.mapping(sc.get("capabilities"), f"{field}.securityContext.capabilities")
    for key in ("add", "drop"):
        caps_field = f"{field}.securityContext.capabilities.{key}"
        for index, item in enumerate(check.sequence(capabilities.get(key), caps_field)):
            check.string(item, f"{caps_field}[{index}]", required=True)
    _check_seccomp(check, sc.get("seccompProfile"), f"{field}.securityContext.seccompProfile")


def _show(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())
