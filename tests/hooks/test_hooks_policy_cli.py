"""runtime-hooks policy show / check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from runtimeproxy.hooks import cli as cli_module
from runtimeproxy.hooks.cli import cli
from runtimeproxy.hooks.discovery import DiscoveryResult, settings_specs
from runtimeproxy.hooks.policy import Policy, default_policy, dump_policy, loads_policy
from runtimeproxy.hooks.sdk import Plugin, discover_plugins

from runtimeproxy.hookapi.hookpoints import HookPoint

# What the commands read a policy against: the installed plugins' settings (the built-ins here).
SPECS = settings_specs(discover_plugins().plugins)
DEFAULTS = default_policy(SPECS)


def load(text: str) -> Policy:
    return loads_policy(text, specs=SPECS)


def entry(policy: Policy, plugin: str, qos: str) -> object:
    return policy.section(SPECS[plugin]).for_class(qos)


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner(env=env).invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_show_prints_the_defaults_without_a_file() -> None:
    code, out, err = invoke("policy", "show")
    assert code == 0, err
    assert out.startswith("# effective runtime-hooks policy: the built-in defaults\n")
    assert load(out) == DEFAULTS
    assert out.endswith(dump_policy(DEFAULTS))


def test_show_lays_the_file_over_the_defaults(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("resctrl:\n  BE: {l3_percent_range: [0, 20]}\nreconciler: {interval_seconds: 30}\n")
    code, out, err = invoke("policy", "show", "--policy", str(policy))
    assert code == 0, err
    assert f"the defaults with {policy} laid over them" in out.splitlines()[0]
    shown = load(out)
    assert entry(shown, "resctrl", "BE").l3_percent_range == (0, 20)  # type: ignore[attr-defined]
    assert entry(shown, "resctrl", "BE").mb_percent == entry(DEFAULTS, "resctrl", "BE").mb_percent  # type: ignore[attr-defined]
    assert shown.reconciler.interval_seconds == 30
    assert shown.sections["cpu"] == DEFAULTS.sections["cpu"]
    assert "l3_percent_range: [0, 20]" in out  # every key is printed, flow lists as in the file
    # The variable the service sets works too.
    assert invoke("policy", "show", env={"RUNTIME_HOOKS_POLICY": str(policy)})[1] == out


def test_show_with_a_missing_file_gives_the_defaults_and_a_warning(tmp_path: Path) -> None:
    code, out, err = invoke("policy", "show", "--policy", str(tmp_path / "none.yaml"))
    assert code == 0
    assert load(out) == DEFAULTS
    assert "does not exist" in err and "does not exist" in out.splitlines()[0]


def test_show_refuses_an_invalid_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("cpu:\n  BE: {cfs_burst_percent: -1}\n")
    code, out, err = invoke("policy", "show", "--policy", str(policy))
    assert code == 1 and out == ""
    assert f"{policy}: cpu.BE.cfs_burst_percent:" in err


def test_check_accepts_a_good_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("network:\n  interface: eth0\n")
    assert invoke("policy", "check", str(policy)) == (0, "ok\n", "")
    # The whole dumped policy is a good file too.
    policy.write_text(dump_policy(DEFAULTS))
    assert invoke("policy", "check", str(policy))[:2] == (0, "ok\n")


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("cpu:\n  BE: {cfs_burst_percent: -1}\n", "cpu.BE.cfs_burst_percent", ""),
        ("resctrl:\n  BE: {l3_percent_range: [30, 20]}\n", "resctrl.BE.l3_percent_range", ""),
        ("cpu:\n  BF: {cpu_idle: true}\n", "cpu.BF", "unknown QoS class 'BF'"),
        ("rdma: {}\n", "rdma", ""),
        ("reconciler: {interval_seconds: 0}\n", "reconciler.interval_seconds", ""),
        ("cpu: [\n", "", "not valid YAML"),
    ],
)
def test_check_names_file_path_and_reason(tmp_path: Path, text: str, path: str, reason: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    code, out, err = invoke("policy", "check", str(policy))
    assert code == 1 and out == ""
    assert err.startswith(f"runtime-hooks: {policy}: {path + ': ' if path else ''}"), err
    assert reason in err
    assert len(err.splitlines()) == 1


def test_check_of_a_missing_file(tmp_path: Path) -> None:
    code, _, err = invoke("policy", "check", str(tmp_path / "none.yaml"))
    assert code == 1 and "cannot read the file" in err


def test_check_needs_a_file() -> None:
    code, _, err = invoke("policy", "check")
    assert code == 2 and "Missing argument 'FILE'" in err


# --- a third-party plugin's section ----------------------------------------------------------------


@dataclass(frozen=True)
class StampSettings:
    value: str = "none"


@pytest.fixture
def with_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-ins plus a third-party plugin with settings of its own, as if installed."""
    stamp = Plugin("stamp", settings=StampSettings)
    stamp.on(HookPoint.PRE_CREATE_CONTAINER)(lambda **kwargs: None)
    found = discover_plugins()
    monkeypatch.setattr(cli_module, "discover_plugins", lambda: DiscoveryResult((*found.plugins, stamp), ()))


def test_show_and_check_include_a_third_party_plugins_section(with_stamp: None, tmp_path: Path) -> None:
    code, out, err = invoke("policy", "show")
    assert code == 0, err
    assert "stamp:\n  LSE:\n    value: none\n" in out  # its dataclass's defaults, every class
    policy = tmp_path / "policy.yaml"
    policy.write_text("stamp: {BE: {value: be-stamp}, LS: {value: ls-stamp}}\n")
    assert invoke("policy", "check", str(policy)) == (0, "ok\n", "")
    code, out, err = invoke("policy", "show", "--policy", str(policy))
    assert code == 0 and "  BE:\n    value: be-stamp\n" in out and "  LS:\n    value: ls-stamp\n" in out
    policy.write_text("stamp: {BE: {valu: x}}\n")
    code, _, err = invoke("policy", "check", str(policy))
    assert code == 1 and err == f"runtime-hooks: {policy}: stamp.BE.valu: unknown key 'valu' (valid keys: value)\n"
    policy.write_text("stamp: {BE: {value: 3}}\n")
    assert "stamp.BE.value: must be a string, got 3" in invoke("policy", "check", str(policy))[2]


def test_a_section_no_installed_plugin_defines_is_refused_naming_those_that_do(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("stamp: {BE: {value: be-stamp}}\n")  # the stamp plugin is not installed here
    code, _, err = invoke("policy", "check", str(policy))
    assert code == 1
    assert "stamp: unknown section 'stamp': no installed plugin defines it" in err
    assert "plugin sections: cpu, cpuset, gpu, memory, network, resctrl; server sections: reconciler, trust" in err
