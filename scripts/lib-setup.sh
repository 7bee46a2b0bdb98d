# shellcheck shell=bash
# Shared set-up for scripts/quickstart and scripts/run-tests: a virtual environment with
# slurmfm installed from this checkout. Sourced, not run.

# ensure_venv EXTRAS: create $SLURMFM_VENV (default .venv) if needed, install slurmfm with
# EXTRAS (e.g. "test") and CPU torch, then put the venv first on PATH. Jobs inherit PATH from
# the submitting shell (sbatch --export=ALL), so their python3 is this venv's.
ensure_venv() {
  local extras=$1 venv=${SLURMFM_VENV:-$PWD/.venv} spec=.
  if ! "${PYTHON:-python3}" -m venv --help >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
  fi
  if [[ ! -x $venv/bin/python ]]; then
    echo "setup: creating $venv" >&2
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  [[ -n $extras ]] && spec=".[${extras}]"
  echo "setup: installing slurmfm${extras:+[$extras]} and torch (CPU) into $venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$spec"
  # CPU build of torch for the local lab's real torchrun jobs (see README, "Quickstart").
  # These machines keep that wheel in a local directory; use it even if PIP_FIND_LINKS is unset.
  local links=()
  if [[ -d /opt/wheels ]]; then links=(--find-links /opt/wheels); fi
  "$venv/bin/python" -m pip install -q "${links[@]}" "torch==${SLURMFM_TORCH_VERSION:-2.13.0}" numpy
  export VIRTUAL_ENV=$venv
  export PATH="$venv/bin:$PATH"
  hash -r
}
