"""A real containerd started as a plain subprocess in a fresh temporary root.

Everything it owns lives under `root_dir` (config, content, state, runc root, netns
mounts, CNI IPAM data, log) except what containerd (1.6, 1.7 and 2.x alike) and CNI
hard-code on the host: shim sockets in /run/containerd/s, CNI result caches in
/var/lib/cni/results, the CNI bridge link, and cgroups (under `cgroup_prefix` when callers use
`cgroup_parent()`, else /k8s.io/<id>). `stop()` removes all of those. It runs the
system's containerd, or another build's binaries (`runtimes.ContainerdBuild`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

import grpc

from .images import ImageSpec, build_image_tar, pause_image_spec, test_image_spec
from .runtimes import ContainerdBuild, system_build

NAMESPACE = "k8s.io"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SHIM_SOCKET_DIR = Path("/run/containerd/s")
CNI_RESULTS_DIR = Path("/var/lib/cni/results")
CNI_BIN_DIR = "/usr/lib/cni"
_RUNTIME = "/runtime.v1.RuntimeService/"
_IMAGES = "/runtime.v1.ImageService/"
# Host paths containerd or CNI create on demand; removed at stop only if we made them.
_HOST_DIRS = (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent, CNI_RESULTS_DIR, CNI_RESULTS_DIR.parent)


class ContainerdError(RuntimeError):
    """containerd failed to start, answer or clean up."""


# -- minimal protobuf wire format: enough for readiness and cleanup, no stubs --------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_field(number: int, value: bytes | str) -> bytes:
    """One length-delimited protobuf field (a string or an embedded message)."""
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def decode_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Yield (field number, value) of a protobuf message; varints as int, else bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            yield number, value
            continue
        if wire == 2:
            size, pos = _read_varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, data[pos:pos + size]
        pos += size


def _bytes_fields(data: bytes, number: int) -> list[bytes]:
    return [v for n, v in decode_fields(data) if n == number and isinstance(v, bytes)]


# -- host inspection and cleanup ----------------------------------------------------


def _unescape_mount(path: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first."""
    prefix = str(root)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape_mount(line.split()[4])
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def _proc_refs(pid: int, root: str) -> bool:
    """Runs with its working directory under `root` (the daemon, shims: their bundle),
    or is a shim naming `root` (its -address). Clients such as a proxy under test are
    left alone even when their command line names the socket."""
    with contextlib.suppress(OSError):
        cwd = os.readlink(f"/proc/{pid}/cwd")
        if cwd == root or cwd.startswith(root + "/"):
            return True
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        return comm.startswith("containerd-shim") and root in cmdline
    return False


def processes_referencing(root: Path) -> list[int]:
    """Live processes of this test bed: the daemon and its shims."""
    me = os.getpid()
    pids = (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    return sorted(pid for pid in pids if pid != me and _proc_refs(pid, str(root)))


def _kill_and_wait(pids: Iterable[int], timeout: float = 10.0) -> None:
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    # A killed shim lingers as a zombie of init for a moment: its cmdline is empty then.
    while time.monotonic() < deadline and any(Path(f"/proc/{p}/cmdline").exists()
                                              and Path(f"/proc/{p}/cmdline").read_bytes()
                                              for p in pids):
        time.sleep(0.05)


def _umount(point: str) -> None:
    done = subprocess.run(["umount", point], capture_output=True, check=False)
    if done.returncode != 0:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _rmdir_tree(path: Path) -> None:
    """Remove a cgroup directory tree bottom-up; busy or non-empty ones stay."""
    if not path.is_dir():
        return
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def cgroup_hierarchies() -> list[Path]:
    """Mounted cgroup hierarchies (v1 controllers, name=systemd, unified)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())


def _log_tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def _overlay_works(scratch: Path) -> bool:
    """Whether overlayfs mounts here (it may not inside some nested containers)."""
    dirs = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    opts = "lowerdir={lower},upperdir={upper},workdir={work}".format(**dirs)
    done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(dirs["merged"])],
                          capture_output=True, check=False)
    if done.returncode == 0:
        _umount(str(dirs["merged"]))
    shutil.rmtree(scratch, ignore_errors=True)
    return done.returncode == 0


# -- configuration ------------------------------------------------------------------


def _q(value: str) -> str:
    # A JSON string is a valid TOML basic string for the paths and names used here.
    return json.dumps(value)


def render_nri(root: Path, socket: Path | None) -> str:
    """The NRI section: with ``socket``, on and serving it with no pre-installed plugins
    (the directories under ``root`` stay empty); without, explicitly off, since 2.x turns
    NRI on by default on the host's NRI socket. 1.6 has no NRI and must not get it."""
    if socket is None:
        return """
[plugins."io.containerd.nri.v1.nri"]
  disable = true
"""
    return f"""
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = {_q(str(socket))}
  plugin_path = {_q(str(root / "nri" / "plugins"))}
  plugin_config_path = {_q(str(root / "nri" / "conf.d"))}
"""


def _render_daemon(root: Path, version: int, disabled_plugins: tuple[str, ...]) -> str:
    """The top of a config: its own root, state, sockets; no debug or metrics listener."""
    disabled = ", ".join(_q(name) for name in disabled_plugins)
    return f"""version = {version}
root = {_q(str(root / "root"))}
state = {_q(str(root / "state"))}
oom_score = 0
disabled_plugins = [{disabled}]

[grpc]
  address = {_q(str(root / "containerd.sock"))}
[ttrpc]
  address = {_q(str(root / "containerd.sock.ttrpc"))}
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {_q(str(root / "opt"))}
"""


# Snapshotters that would probe or claim host devices and paths: never used here.
_UNUSED_SNAPSHOTTERS = ("io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                        "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper")
_UNUSED_2X = ("io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs",
              "io.containerd.differ.v1.erofs")


def _render_runc(table: str, root: Path) -> str:
    """The runc runtime (cgroupfs driver, runc state under ``root``) at ``table``."""
    return f"""    default_runtime_name = "runc"
    [{table}.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{table}.runtimes.runc.options]
        Root = {_q(str(root / "runc"))}
        SystemdCgroup = false
"""


def render_config(root: Path, sandbox_image: str, snapshotter: str, cni_conf_dir: Path,
                  nri_socket: Path | None = None, *, major: int = 1) -> str:
    """containerd config for a build of major version ``major``: version 2 for 1.x, version
    3 for 2.x (render_config_v3). No TCP listeners but the loopback stream server; NRI as
    render_nri says (1.6, which has none, gets no section unless asked)."""
    if major >= 2:
        return render_config_v3(root, sandbox_image, snapshotter, cni_conf_dir, nri_socket)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    nri = render_nri(root, nri_socket) if nri_socket is not None else ""
    return _render_daemon(root, 2, _UNUSED_SNAPSHOTTERS) + f"""
[{cri}]
  sandbox_image = {_q(sandbox_image)}
  # runc may not write oom_score_adj -998 here: without this every pod fails.
  restrict_oom_score_adj = true
  # Pod netns mounts go under our state dir instead of /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.cni]
    bin_dir = {_q(CNI_BIN_DIR)}
    conf_dir = {_q(str(cni_conf_dir))}
  [{cri}.containerd]
    snapshotter = {_q(snapshotter)}
{_render_runc(f"{cri}.containerd", root)}{nri}"""


def render_config_v3(root: Path, sandbox_image: str, snapshotter: str, cni_conf_dir: Path,
                     nri_socket: Path | None = None) -> str:
    """containerd 2.x config (version 3): the CRI plugin is split into a runtime part, an
    images part and the server (stream) part; NRI is set either way (render_nri)."""
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    images = 'plugins."io.containerd.cri.v1.images"'
    return _render_daemon(root, 3, _UNUSED_SNAPSHOTTERS + _UNUSED_2X) + f"""
[{images}]
  snapshotter = {_q(snapshotter)}
  [{images}.pinned_images]
    sandbox = {_q(sandbox_image)}
[{runtime}]
  # runc may not write oom_score_adj -998 here: without this every pod fails.
  restrict_oom_score_adj = true
  # Pod netns mounts go under our state dir instead of /var/run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  enable_cdi = false
  [{runtime}.cni]
    bin_dirs = [{_q(CNI_BIN_DIR)}]
    conf_dir = {_q(str(cni_conf_dir))}
  [{runtime}.containerd]
{_render_runc(f"{runtime}.containerd", root)}
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
{render_nri(root, nri_socket)}"""


def render_cni_conflist(name: str, bridge: str, subnet: str, ipam_dir: Path) -> str:
    """A bridge network with no gateway and no masquerade: pods get an address
    without the plugin touching the host's routes, ip_forward or iptables."""
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": False,
            "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                     "dataDir": str(ipam_dir)},
        }],
    }, indent=2)


# -- the test bed -------------------------------------------------------------------


class Containerd:
    """A containerd with the CRI plugin, its own root, local images and cleanup.

    `start()` / `stop()` bracket its life; `restart()` and `stop_daemon()` act on the
    daemon alone, leaving shims and containers running as a real restart does.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        snapshotter: str | None = None,
        pod_network: bool = True,
        pod_subnet: str = "10.244.250.0/24",
        start_timeout: float = 30.0,
        keep_root: bool | None = None,
        build: ContainerdBuild | None = None,
        nri: bool = False,
    ) -> None:
        self._build = build
        self.nri = nri  # NRI on, serving `nri_socket` (containerd 1.7+)
        self.tag = f"rtpx-{secrets.token_hex(4)}"
        self._base_dir = base_dir
        self._root: Path | None = None
        self._snapshotter = snapshotter
        self.pod_network = pod_network
        self.pod_subnet = pod_subnet
        self.start_timeout = start_timeout
        env_keep = os.environ.get("RUNTIMEPROXY_TESTBED_KEEP", "") not in ("", "0")
        self.keep_root = env_keep if keep_root is None else keep_root
        self.pause_spec: ImageSpec = pause_image_spec()
        self.test_spec: ImageSpec = test_image_spec()
        self.timings: dict[str, float] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._channel: grpc.Channel | None = None
        self._imported = False
        self._preexisting: set[Path] = set()
        self._known_ids: set[str] = set()
        self._prepared = False

    # -- paths and names --

    @property
    def root_dir(self) -> Path:
        if self._root is None:
            raise ContainerdError("test bed not prepared: call start() first")
        return self._root

    @property
    def socket(self) -> Path:
        return self.root_dir / "containerd.sock"

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    @property
    def nri_socket(self) -> Path:
        """The NRI socket (served only when the test bed was made with ``nri=True``)."""
        return self.root_dir / "nri.sock"

    @property
    def log_path(self) -> Path:
        return self.root_dir / "containerd.log"

    @property
    def config_path(self) -> Path:
        return self.root_dir / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root_dir / "cni" / "net.d"

    @property
    def runc_root(self) -> Path:
        return self.root_dir / "runc" / NAMESPACE

    @property
    def pause_image(self) -> str:
        return self.pause_spec.ref

    @property
    def test_image(self) -> str:
        return self.test_spec.ref

    @property
    def snapshotter(self) -> str:
        if self._snapshotter is None:
            raise ContainerdError("snapshotter not chosen yet: call start() first")
        return self._snapshotter

    @property
    def cgroup_prefix(self) -> str:
        """Top cgroup (like kubelet's --cgroup-root) that keeps tests off the host's."""
        return self.tag

    @property
    def bridge_name(self) -> str:
        return self.tag  # 13 characters: within the 15 a link name may have.

    def cgroup_parent(self, pod_uid: str, qos: str = "besteffort") -> str:
        """The cgroupfs parent kubelet would send, under this test bed's prefix."""
        middle = "kubepods" if qos == "guaranteed" else f"kubepods/{qos}"
        return f"/{self.cgroup_prefix}/{middle}/pod{pod_uid}"

    @property
    def build(self) -> ContainerdBuild:
        """The containerd binaries this test bed runs (default: the system's, from PATH)."""
        if self._build is None:
            found = system_build()
            if found is None:
                raise ContainerdError("the containerd binary is not on PATH")
            self._build = found
        return self._build

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- life cycle --

    def start(self) -> None:
        """Start the daemon (preparing the root on first use) and wait until ready."""
        if self.running:
            return
        self.prepare()
        began = time.monotonic()
        self._launch()
        self._wait_ready()
        self.timings["ready"] = time.monotonic() - began
        if not self._imported:
            self._import_images()

    def stop_daemon(self, timeout: float = 10.0) -> None:
        """SIGTERM the daemon, SIGKILL it after `timeout`; shims and containers stay."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_log()

    def restart(self) -> None:
        """Stop and start the daemon on the same root and state, as an operator does."""
        self.stop_daemon()
        self.start()

    def stop(self) -> None:
        """Tear everything down; raise ContainerdError if something could not be."""
        if self._root is None:
            return
        if self.running:
            with contextlib.suppress(grpc.RpcError, ContainerdError):
                self.remove_all_pods(timeout=30.0)
        self._known_ids |= self._container_ids()
        self.stop_daemon()
        self._cleanup_host()
        self._prepared = False
        leftovers = self.leftovers()
        if not self.keep_root and not leftovers:
            shutil.rmtree(self._root, ignore_errors=True)
        if leftovers:
            raise ContainerdError(f"test bed {self._root} left behind:\n" + "\n".join(leftovers))

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- calls --

    def channel(self) -> grpc.Channel:
        """A channel to the daemon's socket, kept until the daemon stops."""
        if self._channel is None:
            # Short reconnect backoff: the default 1 s delays readiness after a restart.
            options = [("grpc.max_receive_message_length", 16 * 1024 * 1024),
                       ("grpc.initial_reconnect_backoff_ms", 20),
                       ("grpc.min_reconnect_backoff_ms", 20),
                       ("grpc.max_reconnect_backoff_ms", 200)]
            self._channel = grpc.insecure_channel(self.address, options=options)
        return self._channel

    def call(self, method: str, request: bytes = b"", timeout: float = 30.0) -> bytes:
        """One unary CRI call with raw bytes in and out, e.g. call("RuntimeService/Version")."""
        path = method if method.startswith("/") else f"/runtime.v1.{method}"
        # No serializers: bytes pass through untouched.
        callable_ = self.channel().unary_unary(path, request_serializer=None,
                                               response_deserializer=None)
        response: bytes = callable_(request, timeout=timeout)
        return response

    def ctr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run `ctr` against this daemon in the k8s.io namespace."""
        cmd = [self.build.binary("ctr"), "-a", str(self.socket), "-n", NAMESPACE, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def pod_sandbox_ids(self) -> list[str]:
        """IDs from CRI ListPodSandbox."""
        response = self.call("RuntimeService/ListPodSandbox")
        return [_bytes_fields(item, 1)[0].decode() for item in _bytes_fields(response, 1)]

    def remove_all_pods(self, timeout: float = 30.0) -> None:
        """Stop and remove every pod sandbox (and so its containers) through CRI."""
        for pod_id in self.pod_sandbox_ids():
            self._known_ids.add(pod_id)
            request = encode_field(1, pod_id)
            self.call("RuntimeService/StopPodSandbox", request, timeout)
            self.call("RuntimeService/RemovePodSandbox", request, timeout)

    def image_present(self, ref: str) -> bool:
        """Whether CRI ImageStatus knows `ref` (an empty response means no image)."""
        response = self.call("ImageService/ImageStatus", encode_field(1, encode_field(1, ref)))
        return bool(_bytes_fields(response, 1))

    # -- debugging --

    def describe(self) -> str:
        """What is running and mounted for this test bed, for failure messages."""
        log = self._root and self.log_path
        parts = [f"root: {self._root}", f"daemon pid: {self.pid}", f"log: {log}"]
        if self._root is not None:
            if self.running:
                parts.append("ctr tasks ls:\n" + self.ctr("tasks", "ls").stdout.rstrip())
            parts.append("runc list:\n" + self._runc("list").stdout.rstrip())
            parts.append("processes:\n" + self._ps(processes_referencing(self._root)))
            parts.append("mounts:\n" + "\n".join(mounts_under(self._root)))
            parts.append("log tail:\n" + _log_tail(self.log_path, 20))
        return "\n".join(parts)

    def leftovers(self) -> list[str]:
        """Processes, mounts, cgroups, links and files this test bed still holds."""
        if self._root is None:
            return []
        found = [f"process {pid}" for pid in processes_referencing(self._root)]
        found += [f"mount {point}" for point in mounts_under(self._root)]
        found += [f"cgroup {path}" for path in self._our_cgroups() if path.exists()]
        found += [f"file {path}" for path in self._our_host_files() if path.exists()]
        if self.pod_network and Path(f"/sys/class/net/{self.bridge_name}").exists():
            found.append(f"link {self.bridge_name}")
        return found

    # -- internals: start --

    def prepare(self) -> None:
        """Create the root, config, CNI config and image tar (start() does it once;
        after stop() the next start() gets a fresh root)."""
        if self._prepared:
            return
        self._imported = False
        self._known_ids = set()
        base = self._base_dir or Path(tempfile.gettempdir())
        self._root = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir=base))
        if len(str(self.socket)) > 100:  # sun_path holds 108 bytes
            raise ContainerdError(f"socket path too long for a unix socket: {self.socket}")
        began = time.monotonic()
        if self._snapshotter is None:
            works = _overlay_works(self.root_dir / "overlay-probe")
            self._snapshotter = "overlayfs" if works else "native"
        self._preexisting = {p for p in (*_HOST_DIRS, *self._k8s_cgroups()) if p.exists()}
        self.cni_conf_dir.mkdir(parents=True)
        if self.pod_network:
            conflist = render_cni_conflist(self.tag, self.bridge_name, self.pod_subnet,
                                           self.root_dir / "cni" / "ipam")
            (self.cni_conf_dir / "10-testbed.conflist").write_text(conflist)
        self.config_path.write_text(render_config(self.root_dir, self.pause_image,
                                                  self.snapshotter, self.cni_conf_dir,
                                                  self.nri_socket if self.nri else None,
                                                  major=self.build.major))
        self._build_images()
        self._prepared = True
        self.timings["prepare"] = time.monotonic() - began

    @property
    def images_tar(self) -> Path:
        return self.root_dir / "images.tar"

    def _build_images(self) -> None:
        build_image_tar([self.pause_spec, self.test_spec], self.images_tar)

    def _launch(self) -> None:
        missing = self.build.missing()
        if missing:
            raise ContainerdError(f"{self.build.label} lacks {', '.join(missing)}")
        log = self.log_path.open("ab")
        self._log_file = log
        # A new session keeps a terminal's Ctrl-C from killing the daemon before the
        # test bed's own cleanup runs.
        self._proc = subprocess.Popen(
            [self.build.binary("containerd"), "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=self.root_dir, start_new_session=True, env=self.build.env(),
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last_error = "no attempt"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc else None
                self._fail(f"containerd exited with status {code} while starting")
            if not self.socket.exists():  # connecting earlier only arms grpc's backoff
                time.sleep(0.01)
                continue
            try:
                self.call("RuntimeService/Version", b"", timeout=1.0)
                return
            except grpc.RpcError as err:
                last_error = f"{err.code()}: {err.details()}"
            time.sleep(0.05)
        self.stop_daemon()
        self._fail(f"CRI Version did not answer within {self.start_timeout}s ({last_error})")

    def _import_images(self) -> None:
        began = time.monotonic()
        tar = str(self.images_tar)
        done = self.ctr("images", "import", "--snapshotter", self.snapshotter, tar)
        if done.returncode != 0:
            self._fail(f"ctr images import {tar} failed: {done.stderr.strip()}")
        # CRI learns of imported images from events: wait until it lists them.
        deadline = time.monotonic() + 10.0
        while not all(self.image_present(ref) for ref in (self.pause_image, self.test_image)):
            if time.monotonic() > deadline:
                self._fail("imported images never showed up in CRI ImageStatus")
            time.sleep(0.05)
        self._imported = True
        self.timings["import"] = time.monotonic() - began

    def _fail(self, message: str) -> None:
        tail = _log_tail(self.log_path) if self._root else "(no log)"
        raise ContainerdError(f"{message}\n--- {self._root and self.log_path} (tail) ---\n{tail}")

    def _close_log(self) -> None:
        log, self._log_file = self._log_file, None
        if log is not None:
            log.close()

    # -- internals: cleanup --

    def _runc(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["runc", "--root", str(self.runc_root), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    def _delete_containers(self, ids: list[str]) -> None:
        """`runc delete --force` (kills through the cgroup, removes it), in parallel."""
        cmd = ["runc", "--root", str(self.runc_root), "delete", "--force"]
        procs = [subprocess.Popen([*cmd, cid], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for cid in ids]
        for proc in procs:
            proc.wait(timeout=60)

    def _container_ids(self) -> set[str]:
        """Every container or sandbox ID this daemon has state for."""
        ids = set(self._runc("list", "-q").stdout.split())
        task_dir = self.root_dir / "state" / "io.containerd.runtime.v2.task" / NAMESPACE
        if task_dir.is_dir():
            ids |= {p.name for p in task_dir.iterdir()}
        return ids

    def _cleanup_host(self) -> None:
        root = self.root_dir
        # Containers before shims: a live shim reaps its killed container at once,
        # while an orphan waits for init (PID 1 here reaps only every second or so).
        self._delete_containers(self._runc("list", "-q").stdout.split())
        _kill_and_wait(processes_referencing(root))
        for point in mounts_under(root):
            _umount(point)
        for path in self._our_cgroups():
            _rmdir_tree(path)
        for path in self._our_host_files():
            path.unlink(missing_ok=True)
        if self.pod_network and Path(f"/sys/class/net/{self.bridge_name}").exists():
            del_link = ["ip", "link", "del", self.bridge_name]
            subprocess.run(del_link, capture_output=True, check=False)
        self._remove_host_dirs()

    def _k8s_cgroups(self) -> list[Path]:
        return [h / NAMESPACE for h in cgroup_hierarchies()]

    def _our_cgroups(self) -> list[Path]:
        paths = [h / self.cgroup_prefix for h in cgroup_hierarchies()]
        for parent in self._k8s_cgroups():
            paths += [parent / cid for cid in sorted(self._known_ids)]
        return paths

    def _our_host_files(self) -> list[Path]:
        files = [SHIM_SOCKET_DIR / self._shim_socket_name(cid) for cid in sorted(self._known_ids)]
        if CNI_RESULTS_DIR.is_dir():  # libcni caches <network>-<sandbox id>-<ifname>
            files += sorted(CNI_RESULTS_DIR.glob(f"{self.tag}-*"))
            for cid in sorted(self._known_ids):
                files += sorted(CNI_RESULTS_DIR.glob(f"cni-loopback-{cid}-*"))
        return files

    def _shim_socket_name(self, cid: str) -> str:
        # containerd 1.6, 1.7 and 2.x shims: sha256 of filepath.Join(address, ns, id).
        return hashlib.sha256(f"{self.socket}/{NAMESPACE}/{cid}".encode()).hexdigest()

    def _remove_host_dirs(self) -> None:
        """Remove host directories that did not exist before us, if now empty."""
        for path in (*self._k8s_cgroups(), *_HOST_DIRS):
            if path in self._preexisting:
                continue
            try:
                path.rmdir()
            except OSError as err:
                if err.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EBUSY):
                    raise

    @staticmethod
    def _ps(pids: list[int]) -> str:
        lines = []
        for pid in pids:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                lines.append(f"{pid} {cmd.decode(errors='replace').strip()}")
        return "\n".join(lines)
