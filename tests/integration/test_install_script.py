"""systemd/install.sh's pip step puts the build it is given in place, even at the same version,
and a running agent then restarts on it.

Every edge-agent wheel says 0.1.0, and `pip install --upgrade` of a wheel whose version is
installed keeps the old code and exits 0: an upgrade, or a rollback to another build, did
nothing and said nothing. This drives the script's own `install_package` with two tiny
hand-made wheels of one version (building edge-agent twice would take far longer), into a
fresh venv, offline: pip only looks in a local folder. Its `restart_running` runs against
a `systemctl` on PATH that plays systemd's side (there is no systemd to restart here).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

INSTALL_SH = REPO / "systemd" / "install.sh"


def make_wheel(folder: Path, name: str, version: str, code: str, requires: tuple[str, ...]) -> Path:
    """A pure-Python wheel of one module, `name/__init__.py` holding `code`."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name}/__init__.py": code,
        f"{dist}/METADATA": metadata + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = "".join(
        f"{path},{digest(text)},{len(text.encode())}\n" for path, text in files.items()
    )
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return wheel


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A fresh venv's python; pip comes from ours, through PYTHONPATH (see `install`)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
        check=True,
        timeout=60,
    )
    return tmp_path / "venv" / "bin" / "python"


def unprivileged(folder: Path) -> Path:
    """A folder for PATH whose `id` says a user, not root: should the script's sourced-guard
    break again, a run stops at its root check instead of installing on the test host
    (as root, CI's machine too, it made a user, /opt/edge-agent and the unit)."""
    folder.mkdir(exist_ok=True)
    (folder / "id").write_text("#!/bin/sh\necho 1000\n")
    (folder / "id").chmod(0o755)
    return folder


def install(python: Path, package: Path, deps: Path) -> None:
    """install.sh's install_package, sourced from the script itself, offline."""
    # Only pip itself is borrowed: a folder holding nothing else keeps our packages out.
    borrowed = package.parent.parent / "borrowed"
    if not borrowed.exists():
        borrowed.mkdir()
        (borrowed / "pip").symlink_to(Path(sysconfig.get_paths()["purelib"]) / "pip")
    env = {
        "PATH": f"{unprivileged(package.parent.parent / 'bin')}:/usr/bin:/bin",
        "PYTHONPATH": str(borrowed),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(deps),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    done = subprocess.run(
        ["bash", "-c", 'source "$0" && install_package "$1" "$2"', INSTALL_SH, python, package],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_second_build_of_the_same_version_replaces_the_first(venv: Path, tmp_path: Path) -> None:
    deps = tmp_path / "deps"
    make_wheel(deps, "probe_dep", "1.0", "", ())
    make_wheel(deps, "probe_new_dep", "1.0", "", ())
    first = make_wheel(tmp_path / "a", "probe", "0.1.0", "BUILD = 'a'\n", ("probe_dep",))
    second = make_wheel(
        tmp_path / "b", "probe", "0.1.0", "BUILD = 'b'\n", ("probe_dep", "probe_new_dep")
    )

    install(venv, first, deps)
    site = Path(
        subprocess.check_output(
            [venv, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # Marked in place: a reinstall would write the wheel's (empty) file over it.
    dep_file = site / "probe_dep" / "__init__.py"
    dep_file.write_text("KEPT = True\n")

    install(venv, second, deps)
    running = subprocess.check_output(
        [venv, "-c", "import probe, probe_new_dep; print(probe.BUILD)"], text=True
    )
    assert running.strip() == "b"
    # A dependency already in place is left alone: not every package reinstalled each time.
    assert dep_file.read_text() == "KEPT = True\n"


def test_sourcing_the_script_defines_its_functions_and_installs_nothing(tmp_path: Path) -> None:
    # Sourced as the tests here source it, the old guard (${BASH_SOURCE[0]} != $0) found
    # the two names equal and ran the whole install: as root, a user, /opt/edge-agent and
    # the unit on the test host. `id` here says non-root, so the run stops at its check.
    bin_dir = unprivileged(tmp_path / "bin")
    done = subprocess.run(
        ["bash", "-c", 'source "$0"; echo "sourced: $?"; type -t install_package', INSTALL_SH],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.stdout.split("\n")[:2] == ["sourced: 0", "function"], done.stderr
    assert done.stderr == ""


FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$CALLS"
case "$1" in
  is-active) [ "$ACTIVE" = yes ] ;;
  try-restart) exit "$RESTART_RC" ;;
esac
"""


@pytest.mark.parametrize(
    ("active", "restart_rc", "code", "said"),
    [
        ("yes", 0, 0, "edge-agent restarted on the new build"),
        ("no", 0, 0, "Start it with: systemctl start edge-agent"),
        ("yes", 1, 1, "edge-agent did not start again on the new build"),
    ],
)
def test_a_rerun_restarts_a_running_agent_on_the_new_build_and_says_what_it_did(
    tmp_path: Path, active: str, restart_rc: int, code: int, said: str
) -> None:
    # The package is replaced on every run: a running agent left as it was kept the old
    # build, loading the new one's modules as it imported them lazily, and the script's
    # last words were "Start with: systemctl start", which does nothing to a running unit.
    bin_dir = unprivileged(tmp_path / "bin")
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "ACTIVE": active,
        "RESTART_RC": str(restart_rc),
    }
    done = subprocess.run(
        ["bash", "-c", 'set -euo pipefail; source "$0" && restart_running', INSTALL_SH],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == code, done.stderr
    assert said in done.stderr
    # try-restart whatever the state: systemd restarts the unit only if it runs (or is
    # waiting to be restarted after a failure).
    assert "try-restart edge-agent.service" in calls.read_text().splitlines()


def test_a_venv_left_without_pip_is_made_anew_after_python3_venv_is_installed(
    tmp_path: Path,
) -> None:
    # Debian and Ubuntu ship python3 without ensurepip (python3-venv): the first run left
    # /opt/edge-agent/bin/python with no pip and failed, and every run after it, seeing
    # bin/python, kept that venv and failed at pip. Here: such a leftover, and a python3
    # without ensurepip until apt-get (played on PATH) has run.
    prefix = tmp_path / "opt"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    bin_dir = unprivileged(tmp_path / "bin")
    real = Path(sys.base_prefix) / "bin" / "python3"
    installed = tmp_path / "python3-venv-installed"
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && [ ! -e {installed} ] && exit 1\nexec {real} "$@"\n'
    )
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/apt\ntouch {installed}\n')
    for tool in ("python3", "apt-get"):
        (bin_dir / tool).chmod(0o755)

    def make_venv() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", 'set -euo pipefail; source "$0" && make_venv "$1"', INSTALL_SH, prefix],
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = make_venv()
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "apt").read_text().splitlines() == [
        "update",
        "install -y --no-install-recommends python3 python3-venv",
    ]
    pip = subprocess.run([prefix / "bin" / "python", "-m", "pip", "--version"], check=False)
    assert pip.returncode == 0
    # A venv with its pip is kept as it is: a re-run does not make it again.
    marker = prefix / "kept"
    marker.write_text("")
    again = make_venv()
    assert again.returncode == 0, again.stderr
    assert marker.exists()
