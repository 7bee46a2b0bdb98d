# shellcheck shell=bash
# Shared set-up for scripts/quickstart and scripts/run-tests: a virtual environment with
# slurmfm installed from this checkout; for the lab scripts (slurm-lab, obs-stack, pyxis-lab,
# pyslurm-lab), the Debian packages, the lab root's check and the check of the sources in
# ../shared/vendor/. Sourced, not run.

# vendor_digest VENDOR FILE...: check each FILE in the folder VENDOR against that folder's
# SHA256SUMS (each must be listed there) and print a short digest of their lines in it, in the
# file's order: a build cached under that digest is rebuilt when a source changes. Fails,
# printing why, when a file is missing, unlisted or altered.
vendor_digest() {
  local vendor=$1 lines
  shift
  lines=$(cd "$vendor" && awk -v want=" $* " '
    { name = $2; sub(/^\*/, "", name) }
    index(want, " " name " ") { print; n++ }
    END { exit n == split(want, w, " ") ? 0 : 1 }' SHA256SUMS) ||
    { echo "vendor: not all of $* are listed in $vendor/SHA256SUMS" >&2; return 1; }
  (cd "$vendor" && sha256sum -c --quiet >&2 <<<"$lines") || return 1
  sha256sum <<<"$lines" | cut -c1-16
}

# dir_unsafe DIR: one line saying why a lab root DIR is not safe to use, or nothing when it is.
# Safe: a real directory (not a link) of root's (the labs run as root) that no one else may
# write, in a parent that no one else may change (root's, and not writable by others unless
# sticky, like /var/tmp). Why: the default roots have predictable names in /var/tmp, where any
# user may make a directory first and put links or files in it that the labs, run as root,
# would write through or start, or an env.sh that users source. The job runtime checks its
# own directory by the same rule (slurmfm/job/install.py).
dir_unsafe() {
  local d=$1 parent uid mode fix="remove it, or set SLURMFM_LAB_ROOT to a directory of your own"
  parent=$(dirname -- "$d")
  if ! read -r uid mode < <(stat -L -c '%u %a' -- "$parent" 2>/dev/null); then
    echo "$parent cannot be read"
    return 0
  fi
  if [[ $uid != 0 ]] || (((8#$mode & 8#022) && !(8#$mode & 8#1000))); then
    echo "$parent (uid $uid, mode $mode) may be changed by another user, who could replace $d: use a lab root elsewhere (SLURMFM_LAB_ROOT)"
  elif [[ -L $d || ! -d $d ]]; then
    echo "$d is not a directory but a link or a file: another user may have put it there; $fix"
  elif read -r uid mode < <(stat -c '%u %a' -- "$d") && [[ $uid != 0 ]]; then
    echo "$d belongs to uid $uid, not to root: another user may have made it; $fix"
  elif ((8#$mode & 8#022)); then
    echo "$d is writable by others (mode $mode): chmod go-w it, or set SLURMFM_LAB_ROOT to a directory of your own"
  fi
}

# apt_get install PKG...: apt-get with the dpkg lock waited for (other installs may hold it),
# the package lists fetched once per run, and no prompts. An install keeps a systemd host from
# starting the packages' services (Slurm's, Prometheus', sshd: the labs start their own) with
# a policy-rc.d that refuses them, as slurm-lab and obs-stack do, unless one is there.
APT_UPDATED=${APT_UPDATED:-0}
apt_get() {
  local opts=(-o DPkg::Lock::Timeout=600 -y -qq) policy=/usr/sbin/policy-rc.d made=0 rc=0
  if [[ $1 == install && $APT_UPDATED == 0 ]]; then
    apt-get "${opts[@]}" update >/dev/null
    APT_UPDATED=1
  fi
  if [[ $1 == install && ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" "$@" >/dev/null || rc=$?
  if ((made)); then rm -f "$policy"; fi
  return "$rc"
}

# ensure_debs PKG...: install the Debian packages that are not installed yet.
ensure_debs() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "setup: apt-get install ${missing[*]}" >&2
  apt_get install --no-install-recommends "${missing[@]}"
}

# pip_install PYTHON ARGS...: pip install, quietly. With PYTHONPYCACHEPREFIX set (the test run
# sets it, scripts/run-tests) Python reads bytecode only under that prefix, never the files
# pip compiles beside the sources, so pip skips compiling (~55 s of CPU for torch and the
# test dependencies); the modules a run imports are compiled once, into the prefix.
pip_install() {
  local py=$1
  shift
  if [[ -n ${PYTHONPYCACHEPREFIX:-} ]]; then
    "$py" -m pip install -q "$@" --no-compile
  else
    "$py" -m pip install -q "$@"
  fi
}

# ensure_venv EXTRAS: create $SLURMFM_VENV (default .venv) if needed, install slurmfm with
# EXTRAS (e.g. "test") and CPU torch, then put the venv first on PATH. Jobs inherit PATH from
# the submitting shell (sbatch --export=ALL), so their python3 is this venv's.
ensure_venv() {
  local extras=$1 venv=${SLURMFM_VENV:-$PWD/.venv} spec=.
  if [[ ! -x $venv/bin/python ]]; then
    echo "setup: creating $venv" >&2
    # `python3 -m venv --help` works without Debian's python3-venv; creating one does not
    # (no ensurepip). So try for real, and install the package when that fails.
    if ! "${PYTHON:-python3}" -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      echo "setup: python3 -m venv failed; installing python3-venv" >&2
      apt_get install python3-venv
      "${PYTHON:-python3}" -m venv "$venv"
    fi
  fi
  [[ -n $extras ]] && spec=".[${extras}]"
  # A second run installs nothing when nothing changed: the package is installed editable (the
  # code is read from the checkout), so only its dependencies (pyproject.toml), the extras, the
  # torch version and the interpreter can call for a new install. A stamp per extras records
  # them; the base install is also satisfied by the test install (a superset).
  local want stamp ok="" stamps=("$venv/.slurmfm-setup${extras:+-$extras}")
  [[ -n $extras ]] || stamps+=("$venv/.slurmfm-setup-test")
  want="extras=$extras editable=compat torch=${SLURMFM_TORCH_VERSION:-2.13.0} $(sha256sum pyproject.toml | cut -d' ' -f1) $("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none)"
  for stamp in "${stamps[@]}"; do
    local have=""
    [[ -f $stamp && ! -L $stamp ]] && have=$(<"$stamp")
    if [[ -n $have && ${have#* } == "${want#* }" ]]; then ok=1; break; fi
  done
  if [[ -n $ok ]] && "$venv/bin/python" -c 'import slurmfm, torch' 2>/dev/null; then
    echo "setup: $venv already has slurmfm${extras:+[$extras]} and torch (CPU); nothing to install (rm $venv/.slurmfm-setup* to force)" >&2
  else
    echo "setup: installing slurmfm${extras:+[$extras]} and torch (CPU) into $venv" >&2
    pip_install "$venv/bin/python" --upgrade pip
    # torch first: a test dependency (lightning) requires torch, and pip would satisfy that with
    # PyPI's CUDA build (several GB) when no torch is installed yet.
    ensure_cpu_torch "$venv/bin/python"
    # setuptools warns that an editable install lets same-named folders shadow the package
    # (BuildBackendWarning, ~10 lines): noise before every quickstart's output, nothing to act on.
    # Compat mode: the checkout's directory in a plain .pth line. setuptools' default editable
    # mode installs an import finder that `site` imports at every start of the venv's Python
    # (pathlib, re, urllib, ...): 113 ms for `python -c pass` against 23 ms here, paid by every
    # process that starts the venv's Python without -S (CLI calls, stand-ins, pytest workers;
    # the job runtime runs with -S). A whole test run did not show it above the machine's
    # drift (docs/testing.md, 2026-12-07, late)
    # (https://setuptools.pypa.io/en/latest/userguide/development_mode.html, "Legacy behavior").
    PYTHONWARNINGS=ignore pip_install "$venv/bin/python" -e "$spec" --config-settings editable_mode=compat
    printf '%s\n' "$want" >"$venv/.slurmfm-setup${extras:+-$extras}"
  fi
  venv_on_path "$venv"
}

# venv_on_path VENV: VENV's python and scripts first on PATH (after ensure_venv ran in a
# subshell, as scripts/run-tests does beside its apt-get).
venv_on_path() {
  export VIRTUAL_ENV=$1
  export PATH="$1/bin:$PATH"
  hash -r
}

# ensure_cpu_torch PYTHON: the CPU build of torch (for the lab's real torchrun jobs, README.md,
# "Quickstart"), and say where it comes from. PyPI's torch wheel for Linux is the CUDA build and
# pulls about 20 nvidia-* packages (several GB), which a CPU-only lab never uses; so:
#   1. a local CPU wheel for this Python ($SLURMFM_WHEELS, default /opt/wheels): installed from
#      the file, nothing downloaded for torch itself;
#   2. else PyTorch's CPU index, https://download.pytorch.org/whl/cpu (a ~190 MB wheel for
#      2.13.0 on x86_64), with its small pure-Python dependencies from the usual index.
ensure_cpu_torch() {
  local py=$1 ver=${SLURMFM_TORCH_VERSION:-2.13.0} wheels=${SLURMFM_WHEELS:-/opt/wheels} tag whl
  if "$py" -c "import sys, torch; sys.exit(torch.__version__ != '$ver+cpu')" 2>/dev/null; then
    echo "setup: torch $ver+cpu already installed" >&2
    pip_install "$py" numpy
    return 0
  fi
  tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  whl=$(compgen -G "$wheels/torch-$ver+cpu-$tag-$tag-*x86_64.whl" | head -n 1 || true)
  if [[ -n $whl ]]; then
    echo "setup: torch $ver CPU build from the local file $whl (not downloaded)" >&2
    pip_install "$py" "$whl" numpy
  else
    echo "setup: downloading torch $ver CPU build (~190 MB) from https://download.pytorch.org/whl/cpu" >&2
    pip_install "$py" --extra-index-url https://download.pytorch.org/whl/cpu "torch==$ver+cpu" numpy
  fi
}
