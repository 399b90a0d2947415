"""`runtime-proxy install` and `uninstall`: what systemd/INSTALL.md does by hand, done on a host
(``/``, or the host mounted elsewhere with `--root`), idempotently and undoably.

Install: the launchers (from a bundle, `--from`, or already in /usr/local/bin), both units and
their settings files, the hook config directory; then ``systemctl enable --now`` of runtime-hooks
and runtime-proxy; then it waits until the proxy answers a CRI Version call through its socket,
and only then writes kubelet's drop-in (pointing --container-runtime-endpoint at the proxy) and
restarts kubelet. A proxy that never answers leaves kubelet as it was. Everything is compared
with what the host holds first: a second install changes nothing and says so, and a newer
version changes only what differs (restarting the units whose files changed).

Every change is recorded before it is made (`install_record`: what each path held before); uninstall
puts kubelet back first (restoring what its drop-in path held, restarting it), then stops and
disables the units, restores every other path, and removes the directories install made. A
settings file edited since install is kept (and said so): it holds the operator's settings.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath

from runtimeproxy.common.endpoints import EndpointError, socket_path
from runtimeproxy.proxy.artifact import Bundle, BundleError
from runtimeproxy.proxy.host_root import ABSENT, FileState, HostRoot, sha256
from runtimeproxy.proxy.host_systemd import Systemctl, SystemdError
from runtimeproxy.proxy.install_record import RECORD_PATH, InstallRecord, RecordError
from runtimeproxy.proxy.readiness import NotServing, wait_until_serving

__all__ = ["InstallError", "InstallOptions", "install", "uninstall"]

PROXY = "runtime-proxy.service"
HOOKS = "runtime-hooks.service"
KUBELET = "kubelet.service"
UNIT_DIR = "/etc/systemd/system"
KUBELET_DROP_IN = f"{UNIT_DIR}/kubelet.service.d/10-runtime-proxy.conf"
SETTINGS = {PROXY: "/etc/default/runtime-proxy", HOOKS: "/etc/default/runtime-hooks"}
SETTING_PREFIX = {PROXY: "RUNTIME_PROXY_", HOOKS: "RUNTIME_HOOKS_"}
HOOK_CONFIG_DIR = "/etc/runtime/hookserver.d"
BUNDLE_DIR = "/opt/runtimeproxy"
LAUNCHER_DIR = "/usr/local/bin"
LAUNCHERS = ("runtime-proxy", "runtime-hooks")  # what the units' ExecStart= run
DEFAULT_ENDPOINT = "/var/run/runtimeproxy/runtimeproxy.sock"
# Start order: the hook server registers before the proxy serves (either order works).
UNITS = (HOOKS, PROXY)

# Kinds of written path. A unit or drop-in is always the shipped one (local changes go in
# drop-ins of their own); a settings file is the operator's once edited.
UNIT, SETTINGS_FILE, LAUNCHER = "unit", "settings", "launcher"

Say = Callable[[str], None]


class InstallError(RuntimeError):
    """Why install or uninstall stopped; the host keeps what was done before (recorded)."""


@dataclass(frozen=True)
class InstallOptions:
    root: Path = Path("/")
    dry_run: bool = False
    bundle: Path | None = None
    settings: dict[str, tuple[str, ...]] = field(default_factory=dict)  # unit -> KEY=VALUE lines
    kubelet: bool = True
    ready_timeout: float = 60.0
    hooks: bool = True  # False: runtime-hooks runs elsewhere (the Helm chart's DaemonSet), not as a unit

    @property
    def units(self) -> tuple[str, ...]:
        return UNITS if self.hooks else (PROXY,)


def shipped(name: str) -> bytes:
    """A file of systemd/ as this version ships it (package data runtimeproxy.data.systemd)."""
    return resources.files("runtimeproxy.data.systemd").joinpath(*name.split("/")).read_bytes()


def _check_settings(unit: str, lines: Iterable[str]) -> list[str]:
    prefix = SETTING_PREFIX[unit]
    checked = []
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(rf"{prefix}[A-Z0-9_]+", key) or "\n" in value or "\r" in value:
            raise InstallError(f"{line!r} is no {prefix}NAME=value setting for {unit}")
        checked.append(f"{key}={value}")
    return checked


def settings_file(unit: str, lines: Iterable[str]) -> bytes:
    """The shipped settings file of `unit` with `lines` appended (set, not commented out)."""
    text = shipped(f"{unit.removesuffix('.service')}.env")
    extra = _check_settings(unit, lines)
    if not extra:
        return text
    return text + b"\n# Set by runtime-proxy install:\n" + "".join(f"{line}\n" for line in extra).encode()


def endpoint_of(settings: bytes) -> str:
    """The socket the proxy serves under `settings` (its last RUNTIME_PROXY_ENDPOINT, else the default)."""
    endpoint = DEFAULT_ENDPOINT
    for line in settings.decode(errors="replace").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "RUNTIME_PROXY_ENDPOINT" and value.strip():
            endpoint = value.strip().strip('"')
    try:
        return socket_path(endpoint)
    except EndpointError as exc:
        raise InstallError(f"RUNTIME_PROXY_ENDPOINT in {SETTINGS[PROXY]}: {exc}") from exc


def kubelet_drop_in(endpoint: str) -> bytes:
    """The shipped kubelet drop-in, its --container-runtime-endpoint set to `endpoint`."""
    return shipped("kubelet.service.d/10-runtime-proxy.conf").replace(
        f"unix://{DEFAULT_ENDPOINT}".encode(), f"unix://{endpoint}".encode())


@dataclass
class Step:
    """One change (or the readiness wait), printed as it is made, or only printed on a dry run."""

    text: str
    run: Callable[[], None]
    changes: bool = True


class Plan:
    """The steps of one install or uninstall, worked out against the host before anything runs."""

    def __init__(self, host: HostRoot, systemctl: Systemctl, record: InstallRecord, say: Say) -> None:
        self.host = host
        self.systemctl = systemctl
        self.record = record
        self.say = say
        self.steps: list[Step] = []
        self._dirs_planned: set[str] = set()

    def add(self, text: str, run: Callable[[], None], *, changes: bool = True) -> None:
        self.steps.append(Step(text, run, changes))

    def systemd(self, *args: str) -> None:
        self.add(f"systemctl {' '.join(args)}", lambda: self.systemctl.run(*args))

    # -- install side --

    def make_parents(self, host_path: str) -> None:
        """Steps making the missing directories above `host_path` (recorded, for uninstall)."""
        missing = []
        for parent in PurePosixPath(host_path).parents:
            if str(parent) in self._dirs_planned or self.host.is_dir(str(parent)):
                break
            missing.append(str(parent))
        for directory in reversed(missing):
            self.make_dir(directory)

    def make_dir(self, directory: str, mode: int = 0o755) -> None:
        if directory in self._dirs_planned or self.host.is_dir(directory):
            return
        self.make_parents(directory)
        self._dirs_planned.add(directory)
        if directory not in self.record.dirs:
            self.record.dirs.append(directory)
        self.add(f"mkdir -m {mode:04o} {directory}", lambda: self.host.make_dir(directory, mode))

    def put(self, host_path: str, wanted: FileState, kind: str) -> bool:
        """A step making `host_path` hold `wanted`, if it does not; whether it will change.
        A settings file that differs from what install wrote last is kept."""
        current = self.host.state(host_path)
        if current == wanted:
            return False
        written = self.record.files.get(host_path)
        if kind == SETTINGS_FILE and current.kind != "absent" and (written is None
                                                                   or sha256(current.content) != written.written):
            self.say(f"keep {host_path} (edited on this host, or not written by install): settings given "
                     "for it are not applied")
            return False
        self.record.note_file(host_path, current, kind)
        self.record.note_written(host_path, wanted.content)
        self.make_parents(host_path)
        verb = "write" if current.kind == "absent" else "replace"
        self.add(f"{verb} {host_path} ({wanted.describe()})", lambda: self.host.put(host_path, wanted))
        return True

    # -- uninstall side --

    def restore(self, host_path: str) -> bool:
        """A step putting back what `host_path` held before install, if it differs now; whether
        it will change."""
        entry = self.record.files[host_path]
        current = self.host.state(host_path)
        if current == entry.previous:
            return False
        if entry.kind == SETTINGS_FILE and current.kind == "file" and sha256(current.content) != entry.written:
            self.say(f"keep {host_path}: edited since install (remove it yourself if its settings are "
                     "no longer wanted)")
            return False
        if entry.previous.kind == "absent":
            self.add(f"remove {host_path}", lambda: self.host.put(host_path, ABSENT))
        else:
            self.add(f"restore {host_path} ({entry.previous.describe()}, as before install)",
                     lambda: self.host.put(host_path, entry.previous))
        return True

    def save_record(self) -> None:
        """The record first: whatever happens next, uninstall knows what to undo."""
        planned = len(self.steps)
        self.make_parents(RECORD_PATH)
        content = self.record.content()
        self.add(f"record the changes in {RECORD_PATH}",
                 lambda: self.host.put(RECORD_PATH, FileState("file", content=content, mode=0o600)))
        first = self.steps[planned:]
        del self.steps[planned:]
        self.steps[:0] = first

    def execute(self, say: Say, dry_run: bool) -> int:
        """Run (or, on a dry run, print) the steps; the number of changes."""
        for step in self.steps:
            say(f"would {step.text}" if dry_run else step.text)
            if not dry_run:
                step.run()
        return sum(step.changes for step in self.steps)


def _preflight(options: InstallOptions, systemctl: Systemctl) -> None:
    if not options.dry_run and os.geteuid() != 0:
        raise InstallError("must run as root: it writes under /etc and calls systemctl (--dry-run does not)")
    if not options.root.is_dir():
        raise InstallError(f"--root {options.root} is no directory")
    try:
        systemctl.check_present()
    except SystemdError as exc:
        raise InstallError(str(exc)) from exc


def _host_python(host: HostRoot) -> str | None:
    """X.Y of the host's /usr/bin/python3 (from the name it resolves to), None without one."""
    path = host.path("/usr/bin/python3")
    match = re.fullmatch(r"python(\d+\.\d+)", path.name)
    return match.group(1) if path.exists() and match else None


def _plan_bundle(plan: Plan, bundle: Bundle) -> bool:
    """Steps unpacking `bundle` as /opt/runtimeproxy and linking its launchers into /usr/local/bin;
    whether anything changes."""
    host = plan.host
    python = _host_python(host)
    if python != bundle.python:
        found = f"Python {python}" if python else "no /usr/bin/python3"
        raise InstallError(f"{bundle.source} is {bundle.label}; the host has {found}: build a bundle for it "
                           f"(python -m runtimeproxy.proxy.artifact --python X.Y)")
    installed = host.path(BUNDLE_DIR)
    current = Bundle.open(installed).info if (installed / "bundle.json").exists() else None
    changed = current != bundle.info
    if changed:
        entry_current = host.state(BUNDLE_DIR)
        if BUNDLE_DIR not in plan.record.files:
            if entry_current.kind != "absent":
                raise InstallError(f"{BUNDLE_DIR} exists and was not installed by runtime-proxy install: "
                                   "move it away first")
            plan.record.note_file(BUNDLE_DIR, ABSENT, "bundle")
        plan.record.bundle = BUNDLE_DIR
        plan.make_parents(BUNDLE_DIR)
        plan.add(f"unpack {bundle.label} as {BUNDLE_DIR}", lambda: _replace_dir(host, bundle))
    for script in LAUNCHERS:
        if script not in bundle.scripts:
            raise InstallError(f"{bundle.source} has no {script} launcher")
        changed |= plan.put(f"{LAUNCHER_DIR}/{script}", FileState("symlink", target=f"{BUNDLE_DIR}/bin/{script}"),
                            LAUNCHER)
    return changed


def _replace_dir(host: HostRoot, bundle: Bundle) -> None:
    """The bundle unpacked beside /opt/runtimeproxy, then swapped in by renames."""
    dest = host.path(BUNDLE_DIR)
    fresh = dest.with_name(f".{dest.name}.new")
    old = dest.with_name(f".{dest.name}.old")
    for leftover in (fresh, old):
        shutil.rmtree(leftover, ignore_errors=True)
    bundle.unpack(fresh)
    if dest.exists():
        dest.rename(old)
    fresh.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def _check_launchers(host: HostRoot) -> None:
    missing = [f"{LAUNCHER_DIR}/{name}" for name in LAUNCHERS if not host.path(f"{LAUNCHER_DIR}/{name}").exists()]
    if missing:
        raise InstallError(f"{', '.join(missing)} not found under {host.root}: install the package (INSTALL.md "
                           "step 1) or give a bundle with --from")


def install(options: InstallOptions, say: Say) -> int:
    """Install on the host at `options.root` (see the module doc); the number of changes made."""
    host = HostRoot(options.root)
    systemctl = Systemctl(host)
    _preflight(options, systemctl)
    try:
        record = InstallRecord.load(host) or InstallRecord()
        bundle = Bundle.open(options.bundle) if options.bundle else None
    except (RecordError, BundleError) as exc:
        raise InstallError(str(exc)) from exc
    plan = Plan(host, systemctl, record, say)
    changed = dict.fromkeys(UNITS, False)
    if bundle is not None:
        changed = dict.fromkeys(UNITS, _plan_bundle(plan, bundle))
    else:
        _check_launchers(host)
    reload = False
    effective: dict[str, bytes] = {}
    for unit in options.units:
        unit_changed = plan.put(f"{UNIT_DIR}/{unit}", FileState("file", shipped(unit), 0o644), UNIT)
        reload |= unit_changed
        wanted = settings_file(unit, options.settings.get(unit, ()))
        current = host.state(SETTINGS[unit])
        settings_changed = plan.put(SETTINGS[unit], FileState("file", wanted, 0o644), SETTINGS_FILE)
        kept = current.kind == "file" and current.content != wanted and not settings_changed
        effective[unit] = current.content if kept else wanted
        changed[unit] |= unit_changed or settings_changed
    plan.make_dir(HOOK_CONFIG_DIR)  # the units' ConfigurationDirectory= would make it, unrecorded
    if reload:
        plan.systemd("daemon-reload")
    if not options.hooks:
        _plan_hooks_unit_off(plan, systemctl, record)
    for unit in options.units:
        if not systemctl.is_enabled(unit) or not systemctl.is_active(unit):
            if not systemctl.is_enabled(unit) and unit not in record.enabled:
                record.enabled.append(unit)
            plan.systemd("enable", "--now", unit)
        elif changed[unit]:
            plan.systemd("restart", unit)
    endpoint = endpoint_of(effective[PROXY])
    socket = host.path(endpoint)

    def ready() -> None:
        try:
            runtime = wait_until_serving(socket, options.ready_timeout)
        except NotServing as exc:
            raise InstallError(f"runtime-proxy is not serving: {exc}. kubelet is left as it was; see "
                               "`journalctl -u runtime-proxy` (the units stay installed: run install again, or "
                               "uninstall)") from exc
        say(f"runtime-proxy answers through {endpoint}: {runtime}")

    plan.add(f"wait up to {options.ready_timeout:g} s for runtime-proxy to answer CRI Version on {endpoint}",
             ready, changes=False)
    _plan_kubelet(plan, options, endpoint, say)
    if any(step.changes for step in plan.steps):
        plan.save_record()
    count = plan.execute(say, options.dry_run)
    if count == 0:
        say(f"nothing to change: runtime-proxy is installed on {host.root} as this version ships it")
    elif options.dry_run:
        say(f"dry run: {count} changes planned, none made")
    else:
        say(f"installed: {count} changes made (recorded in {RECORD_PATH}; `runtime-proxy uninstall` undoes them)")
    return count


def _plan_hooks_unit_off(plan: Plan, systemctl: Systemctl, record: InstallRecord) -> None:
    # A second runtime-hooks would fight the chart's pod for the hook socket's lock: stop the unit
    # an earlier install enabled (its files stay recorded, so uninstall still removes them).
    if HOOKS in record.enabled and (systemctl.is_enabled(HOOKS) or systemctl.is_active(HOOKS)):
        record.enabled.remove(HOOKS)
        plan.systemd("disable", "--now", HOOKS)


def _plan_kubelet(plan: Plan, options: InstallOptions, endpoint: str, say: Say) -> None:
    if not options.kubelet:
        say("kubelet left alone (--no-kubelet): point its --container-runtime-endpoint at "
            f"unix://{endpoint} yourself")
        return
    if not plan.systemctl.is_loaded(KUBELET):
        say(f"{KUBELET} is not installed on this host: its drop-in is skipped (run install again once kubelet "
            "is installed)")
        return
    if plan.put(KUBELET_DROP_IN, FileState("file", kubelet_drop_in(endpoint), 0o644), UNIT):
        plan.systemd("daemon-reload")
        plan.systemd("restart", KUBELET)


def uninstall(options: InstallOptions, say: Say) -> int:
    """Undo what install recorded on the host at `options.root`; the number of changes made."""
    host = HostRoot(options.root)
    systemctl = Systemctl(host)
    _preflight(options, systemctl)
    try:
        record = InstallRecord.load(host)
    except RecordError as exc:
        raise InstallError(str(exc)) from exc
    if record is None:
        say(f"nothing to undo: no {RECORD_PATH} under {host.root} (runtime-proxy install made no changes there)")
        return 0
    plan = Plan(host, systemctl, record, say)
    # kubelet back on its previous endpoint first, while the proxy still serves it.
    if KUBELET_DROP_IN in record.files and plan.restore(KUBELET_DROP_IN):
        plan.systemd("daemon-reload")
        if systemctl.is_loaded(KUBELET):
            plan.systemd("try-restart", KUBELET)
    for unit in reversed(UNITS):
        if unit in record.enabled and (systemctl.is_enabled(unit) or systemctl.is_active(unit)):
            plan.systemd("disable", "--now", unit)
    reload = False
    for path, entry in record.files.items():
        if path == KUBELET_DROP_IN:
            continue
        if path == BUNDLE_DIR:
            if host.path(BUNDLE_DIR).exists():
                plan.add(f"remove {BUNDLE_DIR}", lambda: host.put(BUNDLE_DIR, ABSENT))
            continue
        reload |= plan.restore(path) and entry.kind == UNIT
    if reload:
        plan.systemd("daemon-reload")
    plan.add(f"remove {RECORD_PATH}", lambda: host.put(RECORD_PATH, ABSENT))
    for directory in reversed(record.dirs):
        plan.add(f"rmdir {directory} (if empty)", _remove_dir(host, directory, say))
    count = plan.execute(say, options.dry_run)
    say(f"dry run: {count} changes planned, none made" if options.dry_run
        else f"uninstalled: {count} changes made; the host is as it was before install")
    return count


def _remove_dir(host: HostRoot, directory: str, say: Say) -> Callable[[], None]:
    def remove() -> None:
        if not host.remove_empty_dir(directory):
            say(f"kept {directory}: not empty (holds files install did not write)")
    return remove
