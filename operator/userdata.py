"""The carrier VM's user-data: a pure function from settings to a `#!/bin/bash` cloud-init script.

The script finds (or installs) Python ≥ 3.10, makes a venv under /opt/csbench/venv, installs the probe
package — `csbench[probe]==<version>` from an index, or a dev wheel from a presigned VPC-internal URL checked
against its sha256 — writes `cb-probe.service` and starts it. Every stage is reported to
`carriers/<id>/boot.log` in OSS by bootreport.py (embedded here, stdlib only) with the instance role's STS
credentials, because a VM's serial console is not something the operator can read.

No secret is ever rendered: user-data is readable by anyone with ecs:DescribeUserData. The only credentials
the carrier uses are the instance RAM role's, fetched from the metadata service at run time.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlsplit

MAX_USER_DATA_BYTES = 32 * 1024  # Aliyun's limit on raw user-data
UNIT = "/etc/systemd/system/cb-probe.service"
VENV = "/opt/csbench/venv"
BOOT_LOG = "/var/log/csbench-boot.log"  # everything the script prints
STAGE_LOG = "/var/log/csbench-boot-stages.log"  # one line per stage (uploaded to OSS)

# Settings a caller may pass through to cb-probe (the rest are set from the named arguments).
PASS_THROUGH = frozenset({"CB_PROBE_POLL_INTERVAL", "CB_PROBE_HEARTBEAT_INTERVAL", "CB_PROBE_PROGRESS_INTERVAL",
                          "CB_PROBE_IDLE_TIMEOUT", "CB_PROBE_DRAIN_TIMEOUT", "CB_PROBE_STORE_TIMEOUT",
                          "CB_PROBE_LOG_LEVEL"})
_SAFE = re.compile(r"^[A-Za-z0-9._:/@+,=-]*$")  # needs no quoting in bash or in a systemd Environment= line
_SECRETISH = re.compile(r"(SECRET|TOKEN|PASSWORD|ACCESS_KEY|CREDENTIAL)", re.IGNORECASE)


@dataclass(frozen=True)
class IndexPackage:
    """Install `csbench[probe]==version` from a package index (e.g. the in-region PyPI mirror)."""

    version: str
    index_url: str = "https://pypi.org/simple"


@dataclass(frozen=True)
class DevWheel:
    """Install a wheel fetched from a (presigned, VPC-internal) URL, refused unless its sha256 matches."""

    url: str
    sha256: str
    filename: str  # pip needs the real wheel file name (name-version-tags.whl)


def _safe(name: str, value: str) -> str:
    if not _SAFE.match(value):
        raise ValueError(f"{name}={value!r}: only letters, digits and ._:/@+,=- are allowed in user-data settings")
    return value


def bootreport_source() -> str:
    return resources.files("csbench.probe").joinpath("bootreport.py").read_text()


def render_user_data(
    *,
    bucket: str,
    region: str,
    campaign_uid: str,
    carrier_id: str,
    package: IndexPackage | DevWheel,
    endpoint: str | None = None,
    settings: Mapping[str, str] | None = None,
    python: str | None = None,
    venv_args: Sequence[str] = (),
    pip_args: Sequence[str] = (),
    extra_site_packages: Sequence[str] = (),
    poweroff: bool = True,
) -> str:
    """The user-data script for one carrier.

    python: an interpreter to try first (absolute path); else python3.12/3.11/3.10/python3, else install one.
    venv_args / pip_args: extra arguments (localcloud: `--system-site-packages` / `--no-deps`).
    extra_site_packages: directories added to the venv's path with a .pth file (localcloud: the test venv's
    dependencies, so nothing is downloaded).
    """
    env = {"CB_PROBE_BUCKET": bucket, "CB_PROBE_REGION": region, "CB_PROBE_CAMPAIGN_UID": campaign_uid,
           "CB_PROBE_CARRIER_ID": carrier_id}
    if endpoint:
        env["CB_PROBE_ENDPOINT"] = endpoint
    for name, value in (settings or {}).items():
        if _SECRETISH.search(name) or name not in PASS_THROUGH:
            raise ValueError(f"{name} cannot go into user-data: only {sorted(PASS_THROUGH)} may "
                             "(user-data is readable through DescribeUserData; no secret belongs there)")
        env[name] = str(value)
    for name, value in env.items():
        _safe(name, value)
    for arg in (*venv_args, *pip_args, *extra_site_packages, *([python] if python else [])):
        _safe("argument", arg)

    exports = "\n".join(f"export {k}={v}" for k, v in env.items())
    unit_env = "\n".join(f'Environment="{k}={v}"' for k, v in env.items())
    candidates = " ".join(([python] if python else []) + ["python3.12", "python3.11", "python3.10", "python3"])
    pip = f"$VENV_PY -m pip install --disable-pip-version-check --no-input {' '.join(pip_args)}".rstrip()
    if isinstance(package, IndexPackage):
        _safe("version", package.version)
        _safe("index_url", package.index_url)
        index = f"--index-url {package.index_url}"
        if urlsplit(package.index_url).scheme == "http":
            index += f" --trusted-host {urlsplit(package.index_url).hostname}"
        install = f"""\
report package-install "csbench[probe]=={package.version} from {package.index_url}"
{pip} {index} "csbench[probe]=={package.version}" || fail "pip install csbench[probe]=={package.version} failed"
"""
    else:
        if not re.fullmatch(r"[0-9a-f]{64}", package.sha256):
            raise ValueError(f"sha256 {package.sha256!r} must be 64 lowercase hex digits")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.whl", package.filename):
            raise ValueError(f"wheel filename {package.filename!r} is not a wheel file name")
        install = f"""\
WHEEL=/opt/csbench/{package.filename}
report package-fetch "{package.filename}"
$VENV_PY - "$WHEEL" {package.sha256} {shlex.quote(package.url)} <<'CSBENCH_FETCH_EOF' || fail "dev wheel fetch or sha256 check failed"
import hashlib, sys, urllib.request
dest, want, url = sys.argv[1:4]
body = urllib.request.urlopen(url, timeout=60).read()
got = hashlib.sha256(body).hexdigest()
if got != want:
    sys.exit("sha256 mismatch for the dev wheel: got " + got + ", expected " + want + "; refusing to install")
open(dest, "wb").write(body)
CSBENCH_FETCH_EOF
report package-verified "sha256 {package.sha256[:12]}"
{pip} "$WHEEL[probe]" || fail "pip install of the dev wheel failed"
"""
    pth = ""
    if extra_site_packages:
        dirs = "\\n".join(extra_site_packages)
        pth = f"""\
SITE=$($VENV_PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '{dirs}\\n' > "$SITE/csbench-extra-site.pth"
"""
    script = f"""\
#!/bin/bash
# csbench carrier {carrier_id} of campaign {campaign_uid}. Generated by csbench.operator.userdata; no secrets.
set -u
mkdir -p /var/log /opt/csbench
exec > >(tee -a {BOOT_LOG}) 2>&1  # the serial console and a file on disk
echo "csbench user-data starting at $(date -u +%FT%TZ)"
{exports}
export CB_PROBE_METADATA_URL="${{CSBENCH_METADATA_URL:-http://100.100.100.200}}"
export CB_BOOT_LOG={STAGE_LOG}
cat > /opt/csbench/bootreport.py <<'CSBENCH_BOOTREPORT_EOF'
{bootreport_source().rstrip()}
CSBENCH_BOOTREPORT_EOF
REPORT_PY=$(command -v python3 || true)
report() {{ echo "stage: $*"; if [ -n "$REPORT_PY" ]; then "$REPORT_PY" /opt/csbench/bootreport.py "$@" || true; fi; }}
fail() {{ report failed "$*"; echo "csbench user-data failed: $*"; exit 1; }}
report user-data-started "$(uname -sr)"

find_python() {{
  for c in {candidates}; do
    p=$(command -v "$c" 2>/dev/null) || continue
    if "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  return 1
}}
PY=$(find_python) || true
if [ -z "$PY" ]; then
  report python-install "no Python >= 3.10 found; installing one"
  if command -v dnf >/dev/null; then dnf install -y python3.11 python3.11-pip
  elif command -v yum >/dev/null; then yum install -y python3.11 python3.11-pip
  elif command -v apt-get >/dev/null; then apt-get update -y && apt-get install -y python3 python3-venv python3-pip
  fi
  PY=$(find_python) || fail "no Python >= 3.10 available after trying dnf/yum/apt-get"
fi
REPORT_PY=$PY
report python-ready "$PY $("$PY" -c 'import platform; print(platform.python_version())')"

rm -rf {VENV}
"$PY" -m venv {' '.join(venv_args)} {VENV} || fail "could not create the venv {VENV} with $PY"
VENV_PY={VENV}/bin/python
{pth}{install}[ -x {VENV}/bin/cb-probe ] || fail "{VENV}/bin/cb-probe missing after install"
report package-installed "$($VENV_PY -c 'import csbench; print(csbench.__version__)')"

cat > {UNIT} <<CSBENCH_UNIT_EOF
[Unit]
Description=csbench probe carrier (cb-probe)
Wants=network-online.target
After=network-online.target

[Service]
{unit_env}
Environment="CB_PROBE_METADATA_URL=$CB_PROBE_METADATA_URL"
ExecStart={VENV}/bin/cb-probe{' --poweroff' if poweroff else ''}
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
CSBENCH_UNIT_EOF
systemctl daemon-reload && systemctl enable --now cb-probe || fail "systemctl could not start cb-probe"
report service-started cb-probe
"""
    size = len(script.encode())
    if size > MAX_USER_DATA_BYTES:
        raise ValueError(f"user-data is {size} bytes, over Aliyun's {MAX_USER_DATA_BYTES}-byte limit")
    return script
