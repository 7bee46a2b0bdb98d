"""Backend over slurmrestd (Slurm's REST API) with a JWT: submit from a laptop or a notebook.

Why: AWS PCS and SageMaker HyperPod expose slurmrestd, and a notebook server is not a login
node. The client is the standard library's ``urllib`` (no new dependency).

What it needs (https://slurm.schedmd.com/rest.html, https://slurm.schedmd.com/jwt.html):

- ``SLURMFM_REST_URL``: the server, e.g. ``http://login:6820``.
- ``SLURM_JWT``: the token as ``scontrol token`` prints it (``SLURM_JWT=...`` in a file named
  by ``SLURMFM_REST_TOKEN_FILE`` works too). It goes in the ``X-SLURM-USER-TOKEN`` header only:
  never in a URL, an argv, the job's environment, a log or the history.
- The user name (``X-SLURM-USER-NAME``): ``SLURMFM_REST_USER``, else the token's own ``sun``
  claim (Slurm's tokens name their user there).

The API version is chosen from what the server offers (``GET /openapi/v3`` lists its paths):
the newest this module knows. 22.05 serves v0.0.36-v0.0.38; 24.11 and 26.05 serve the
data_parser versions (v0.0.40 and later), whose job fields differ (time limits and memory as
``{"set", "number"}``, GPUs as ``tres_per_node``, the script inside ``job``).

slurmrestd does not read ``#SBATCH`` lines: the script's directives are translated into the
job description here, and a directive with no field is refused in one line (never dropped).
What REST cannot do at all is said the same way: it cannot read a job's log file.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmfm.backends.base import JobStatus, SubmitResult, new_submit_token
from slurmfm.errors import BackendError

if TYPE_CHECKING:
    from slurmfm.request import SubmitRequest

# The versions this module speaks, oldest first; the newest one the server offers is used.
OLDEST = "v0.0.38"
KNOWN_VERSIONS = (OLDEST, "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44")
_PATH_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")

# The job's PATH when slurmrestd starts it (REST has no submitting shell to inherit from).
DEFAULT_JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

LOGS_UNSUPPORTED = (
    "rest: slurmrestd cannot read a job's log file; read it on the cluster "
    "(slurmfm logs JOBID there) or use --backend ssh"
)


def _vnum(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("."))


def choose_version(paths: list[str] | Mapping[str, Any]) -> str:
    """The newest known API version among the server's OpenAPI ``paths``; pure."""
    offered = {m.group(1) for p in paths if (m := _PATH_VERSION.match(p))}
    usable = [v for v in KNOWN_VERSIONS if v in offered]
    if not usable:
        shown = ", ".join(sorted(offered, key=_vnum)) or "none"
        raise BackendError(
            f"rest: the server offers Slurm API versions {shown}; slurmfm speaks "
            f"{', '.join(KNOWN_VERSIONS)}"
        )
    return max(usable, key=_vnum)


def token_user(token: str) -> str | None:
    """The ``sun`` (Slurm user name) claim of a JWT, read without checking the signature
    (slurmctld checks it); None when the token has none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None
    user = claims.get("sun") if isinstance(claims, dict) else None
    return str(user) if user else None


def token_expiry(token: str) -> int | None:
    """The ``exp`` claim (seconds since the epoch) of a JWT, None when it has none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return int(claims["exp"]) if isinstance(claims, dict) and "exp" in claims else None
    except (IndexError, ValueError, KeyError, TypeError):
        return None


def read_token(env: Mapping[str, str]) -> str:
    """The JWT from ``$SLURM_JWT`` or the file ``$SLURMFM_REST_TOKEN_FILE`` (either as
    ``scontrol token`` prints it, ``SLURM_JWT=...``, or the bare token)."""
    raw = env.get("SLURM_JWT", "")
    if not raw and env.get("SLURMFM_REST_TOKEN_FILE"):
        path = env["SLURMFM_REST_TOKEN_FILE"]
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read(65536)
        except OSError as exc:
            raise BackendError(f"rest: cannot read {path}: {exc.strerror or exc}") from None
    raw = raw.strip()
    if raw.startswith("SLURM_JWT="):
        raw = raw[len("SLURM_JWT=") :]
    if not raw:
        raise BackendError(
            "rest: no token: set SLURM_JWT (scontrol token prints it) or SLURMFM_REST_TOKEN_FILE"
        )
    if any(c.isspace() or ord(c) < 33 for c in raw):
        raise BackendError("rest: SLURM_JWT is not a token (it has spaces or control characters)")
    return raw


# -- the script's directives as a job description ----------------------------------------------
_DIRECTIVE = re.compile(r"^#SBATCH\s+(.*)$")


def directives(script: str) -> list[tuple[str, str | None]]:
    """The ``#SBATCH`` options of ``script`` as ``(option, value)``, in order; sbatch reads
    them up to the first command line (comments and blank lines do not end them)."""
    out: list[tuple[str, str | None]] = []
    for i, line in enumerate(script.splitlines()):
        if i == 0 and line.startswith("#!"):
            continue
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        m = _DIRECTIVE.match(stripped)
        if m is None:
            break
        for word in m.group(1).split():
            if word.startswith("#"):
                break
            if not word.startswith("--"):
                raise BackendError(
                    f"rest: #SBATCH {word}: only long options (--name=value) can be sent "
                    "through slurmrestd"
                )
            name, eq, value = word[2:].partition("=")
            out.append((name, value if eq else None))
    return out


def time_minutes(value: str) -> int:
    """sbatch's ``--time`` forms (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``)
    in whole minutes, rounded up (Slurm rounds seconds up too)."""
    days, _, rest = value.rpartition("-") if "-" in value else ("", "", value)
    parts = [int(p) for p in rest.split(":")]
    d = int(days) if days else 0
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = parts[:3]
    return d * 1440 + h * 60 + m + (1 if s else 0)


def _number(v: int, new: bool) -> Any:
    return {"set": True, "infinite": False, "number": v} if new else v


_MEM = re.compile(r"^(\d+)([KMGT]?)$", re.IGNORECASE)


def _mem_mb(value: str) -> int:
    m = _MEM.match(value)
    if m is None:
        raise BackendError(f"rest: --mem={value}: not a memory size")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return int(int(m.group(1)) * scale)


def _signal(value: str, new: bool) -> dict[str, Any]:
    batch = value.startswith("B:")
    sig, _, delay = value.removeprefix("B:").partition("@")
    if not new:
        if batch:
            # v0.0.38 refuses the B: of "B:USR2@300" ("Invalid SIGNAL specification",
            # 22.05.8), and without it the batch shell, which saves before the time limit,
            # would not get the signal (sbatch(1), --signal)
            raise BackendError(
                f"rest: --signal={value}: Slurm's REST API {OLDEST} cannot signal the batch "
                "shell (B:); use --backend ssh or cli on this cluster"
            )
        return {"signal": value}
    name = sig if sig.isdigit() else "SIG" + sig.removeprefix("SIG")
    out: dict[str, Any] = {
        "kill_warning_signal": name,
        "kill_warning_delay": _number(int(delay or "60"), True),
    }
    if batch:
        out["kill_warning_flags"] = ["BATCH_JOB"]
    return out


def _int_field(key: str) -> Any:
    return lambda val, new: {key: int(val)}


def _text_field(key: str) -> Any:
    return lambda val, new: {key: val}


def _nodes(val: str, new: bool) -> dict[str, Any]:
    lo, _, hi = val.partition("-")
    if new:
        return {"minimum_nodes": int(lo), "maximum_nodes": int(hi or lo)}
    return {"nodes": [int(lo), int(hi or lo)]}


def _exclusive(val: str, new: bool) -> dict[str, Any]:
    if not new:
        return {"exclusive": val or "true"}
    return {"shared": ["none"] if not val else [val]}


def _gpus_per_node(val: str, new: bool) -> dict[str, Any]:
    return {"tres_per_node": f"gres/gpu:{val}"} if new else {"gpus_per_node": val}


# What each #SBATCH option becomes in the job description, per API generation (``new``:
# v0.0.40 and later, the data_parser generation).
_DIRECTIVES: dict[str, Any] = {
    "job-name": _text_field("name"),
    "nodes": _nodes,
    "ntasks-per-node": _int_field("tasks_per_node"),
    "ntasks": _int_field("tasks"),
    "cpus-per-task": _int_field("cpus_per_task"),
    "time": lambda val, new: {"time_limit": _number(time_minutes(val), new)},
    "partition": _text_field("partition"),
    "account": _text_field("account"),
    "qos": _text_field("qos"),
    "reservation": _text_field("reservation"),
    "constraint": _text_field("constraints"),
    "output": _text_field("standard_output"),
    "error": _text_field("standard_error"),
    "requeue": lambda val, new: {"requeue": True},
    "no-requeue": lambda val, new: {"requeue": False},
    "open-mode": lambda val, new: {"open_mode": [val.upper()] if new else val},
    "signal": _signal,
    # v0.0.38 documents a boolean and parses an integer ("Unable to read integer value",
    # 22.05.8)
    "wait-all-nodes": lambda val, new: {"wait_all_nodes": (val != "0") if new else int(val != "0")},
    "exclusive": _exclusive,
    "mem": lambda val, new: {"memory_per_node": _number(_mem_mb(val), new)},
    "gpus-per-node": _gpus_per_node,
}


def _directive_fields(request: SubmitRequest, version: str, new: bool) -> dict[str, Any]:
    """The job description's fields from the script's ``#SBATCH`` lines; an option with no
    field this API generation takes is refused (one line), never dropped."""
    job: dict[str, Any] = {}
    for name, value in directives(request.text):
        field = _DIRECTIVES.get(name)
        if name == "gres" and not new:
            field = _text_field("gres")
        if field is None:
            shown = f"--{name}" + (f"={value}" if value is not None else "")
            raise BackendError(
                f"rest: #SBATCH {shown} has no slurmrestd {version} field slurmfm sends; "
                "use --backend ssh or cli for this job"
            )
        job.update(field(value or "", new))
    return job


def _request_fields(request: SubmitRequest, new: bool) -> dict[str, Any]:
    """The fields the request carries beside its script: array, dependency."""
    if request.sbatch_args:
        raise BackendError(
            f"rest: cannot send sbatch options {' '.join(request.sbatch_args)}; use --backend ssh"
        )
    job: dict[str, Any] = {}
    if request.array is not None:
        job["array"] = request.array.indices
    if request.dependency is not None and request.dependency.has_jobs:
        job["dependency"] = request.dependency.expression()
    if request.kill_on_invalid_dep and new:
        job["flags"] = ["KILL_INVALID_DEPENDENCY"]
    elif request.kill_on_invalid_dep:
        job["kill_on_invalid_dependency"] = True
    return job


def job_description(
    request: SubmitRequest, version: str, environment: Mapping[str, str], comment: str
) -> dict[str, Any]:
    """The JSON body of ``POST /slurm/VERSION/job/submit`` for ``request``; pure."""
    new = _vnum(version) >= (0, 0, 40)
    job = _directive_fields(request, version, new)
    job.update(_request_fields(request, new))
    job["comment"] = comment
    # sbatch runs the job where it was submitted; a REST submission has no such place, so the
    # job runs in SLURMFM_REST_WORKDIR, else its log's directory (which exists: Slurm opens
    # the log there), else /
    out = str(job.get("standard_output", ""))
    cwd = environment.get("SLURMFM_REST_WORKDIR", "")
    job["current_working_directory"] = cwd or (
        out.rsplit("/", 1)[0] or "/" if out.startswith("/") else "/"
    )
    env = {k: v for k, v in environment.items() if k != "SLURMFM_REST_WORKDIR"}
    if new:
        job["environment"] = [f"{k}={v}" for k, v in env.items()]
        job["script"] = request.text
        return {"job": job}
    job["environment"] = env
    return {"job": job, "script": request.text}


# -- what slurmrestd answers --------------------------------------------------------------------
def _plain(value: Any) -> str:
    """A field of either generation as text: v0.0.40+ wrap numbers as ``{"set", "number"}``
    and states as lists."""
    if isinstance(value, dict):
        if "number" in value:
            return str(value["number"]) if value.get("set", True) else ""
        if "return_code" in value:  # exit_code: {"status": [...], "return_code": {...}}
            rc = _plain(value.get("return_code"))
            sig = _plain((value.get("signal") or {}).get("id", "")) or "0"
            return f"{rc or 0}:{sig}"
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def parse_job(record: Mapping[str, Any], job_id: str) -> JobStatus:
    """One job of ``GET /slurm/V/job/ID`` as a status; pure."""
    state = record.get("job_state", "")
    state = state[0] if isinstance(state, list) and state else state
    exit_code = record.get("exit_code", "")
    if isinstance(exit_code, int):
        exit_code = f"{exit_code >> 8}:{exit_code & 0xFF}"  # v0.0.38: the wait status
    else:
        exit_code = _plain(exit_code)
    raw = {k: _plain(v) for k, v in record.items() if not isinstance(v, dict | list)}
    user = record.get("user_name", "")
    uid = _plain(record.get("user_id", ""))
    if user and uid:
        raw["UserId"] = f"{user}({uid})"
    return JobStatus(
        job_id=str(record.get("job_id", job_id)),
        state=str(state or ""),
        reason=_plain(record.get("state_reason", "")),
        nodes=_plain(record.get("nodes", "")),
        exit_code=exit_code,
        restarts=int(_plain(record.get("restart_cnt", 0)) or 0),
        stdout=_plain(record.get("standard_output", "")),
        name=_plain(record.get("name", "")),
        source="slurmrestd",
        raw=raw,
    )


def array_status(tasks: list[JobStatus]) -> JobStatus:
    """One status for a job array's id, picked as the CLI backend picks its record
    (:func:`slurmfm.backends.slurm_cli.array_representative`), with ``ArrayTasks``; pure."""
    import dataclasses

    from slurmfm.backends.slurm_cli import array_representative

    records = [
        {
            "JobState": t.state,
            "ArrayJobId": t.raw.get("array_job_id", ""),
            "ArrayTaskId": t.raw.get("array_task_id", ""),
            "index": str(i),
        }
        for i, t in enumerate(tasks)
    ]
    pick = array_representative(records)
    chosen = tasks[int(pick["index"])]
    raw = {**chosen.raw, "ArrayTasks": pick.get("ArrayTasks", "")}
    return dataclasses.replace(chosen, raw=raw)


def _errors(body: Mapping[str, Any]) -> str:
    out = []
    for e in body.get("errors") or []:
        if isinstance(e, dict):
            text = e.get("description") or e.get("error") or ""
            code = e.get("error_number") or e.get("errno")
            out.append(f"{text} (error {code})" if code else str(text))
    return "; ".join(o for o in out if o)


@dataclass
class _Answer:
    status: int
    body: dict[str, Any]


class LostAnswer(BackendError):
    """The request went out and no answer came back: it may or may not have been done."""


class RestBackend:
    """Slurm through slurmrestd with a JWT (``SLURMFM_REST_URL``, ``SLURM_JWT``)."""

    name = "rest"
    remote = True

    def __init__(
        self,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        url = (url or self.env.get("SLURMFM_REST_URL", "")).rstrip("/")
        if not url:
            raise BackendError("rest: no server: set SLURMFM_REST_URL (e.g. http://login:6820)")
        if not re.match(r"^https?://[^/\s]+$", url):
            raise BackendError(f"rest: SLURMFM_REST_URL={url}: give http(s)://HOST:PORT only")
        self.url = url
        self.timeout = timeout
        self._token = read_token(self.env)
        self.user = self.env.get("SLURMFM_REST_USER") or token_user(self._token) or ""
        if not self.user:
            raise BackendError("rest: the token names no user; set SLURMFM_REST_USER")
        self._version: str | None = None

    def __repr__(self) -> str:  # never the token
        return f"RestBackend(url={self.url!r}, user={self.user!r})"

    # -- HTTP ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> _Answer:
        # An expired token is refused here, before anything is sent: slurmrestd 22.05 answers
        # one with HTTP 500 "slurmctld config is unable to load", not 401.
        exp = token_expiry(self._token)
        if exp is not None and exp <= time.time():
            stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(exp))
            raise BackendError(
                f"rest: the token expired at {stamp}; get a new one with scontrol token"
            )
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310 - http(s) only (checked in __init__)
            self.url + path,
            data=data,
            method=method,
            headers={
                "X-SLURM-USER-NAME": self.user,
                "X-SLURM-USER-TOKEN": self._token,
                "Accept": "application/json",
                **({"Content-Type": "application/json"} if data is not None else {}),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if method == "POST" and not isinstance(reason, ConnectionRefusedError):
                raise LostAnswer(f"rest: {self.url}: {reason}") from None
            raise BackendError(f"rest: cannot reach {self.url}: {reason}") from None
        if status == 401:
            raise BackendError(
                f"rest: {self.url} refused the token (401): expired or not valid for user "
                f"{self.user}; get a new one with scontrol token"
            )
        try:
            parsed = json.loads(raw or b"{}")
        except ValueError:
            parsed = {"errors": [{"description": raw[:200].decode("utf-8", "replace")}]}
        return _Answer(status, parsed if isinstance(parsed, dict) else {})

    def api(self) -> str:
        """The API version used (asked once: ``GET /openapi/v3``)."""
        if self._version is None:
            ans = self._call("GET", "/openapi/v3")
            if ans.status != 200:
                raise BackendError(f"rest: GET /openapi/v3: HTTP {ans.status} {_errors(ans.body)}")
            self._version = choose_version(list(ans.body.get("paths") or {}))
        return self._version

    # -- the backend -----------------------------------------------------------------------
    def version(self) -> str:
        """The cluster's Slurm release, from ``ping``'s ``meta``."""
        ans = self._call("GET", f"/slurm/{self.api()}/ping")
        meta = ans.body.get("meta") or {}
        slurm = meta.get("Slurm") or meta.get("slurm") or {}
        release = slurm.get("release") if isinstance(slurm, dict) else None
        if ans.status != 200 or not release:
            raise BackendError(f"rest: ping: HTTP {ans.status} {_errors(ans.body)}")
        m = re.match(r"\d+\.\d+(?:\.\d+)?", str(release))
        return m.group(0) if m else str(release)

    def job_environment(self, request: SubmitRequest, env: Mapping[str, str]) -> dict[str, str]:
        """What the job gets as its environment: a PATH (``SLURMFM_REST_JOB_PATH``), and the
        variables the job needs from the submitting environment (``request.env_names``); never
        the token, never the rest of this machine's environment."""
        out = {"PATH": env.get("SLURMFM_REST_JOB_PATH") or DEFAULT_JOB_PATH}
        secret_names = {"SLURM_JWT", "SLURMFM_REST_TOKEN_FILE"}
        for name in request.env_names:
            if name in env and name not in secret_names:
                out[name] = env[name]
        if env.get("SLURMFM_REST_WORKDIR"):
            out["SLURMFM_REST_WORKDIR"] = env["SLURMFM_REST_WORKDIR"]
        return out

    def submit(self, request: SubmitRequest, *, env: dict[str, str] | None = None) -> SubmitResult:
        """``POST job/submit`` with a token in the job's comment; when the answer is lost, the
        job is looked for by that token before the request is sent a second (last) time."""
        request.check_submittable()
        token = new_submit_token()
        body = job_description(
            request, self.api(), self.job_environment(request, env or self.env), token
        )
        for attempt in (1, 2):
            try:
                return self._submit_once(body)
            except LostAnswer:
                found = self.find_submitted(token)
                if found is not None:
                    return SubmitResult(job_id=found, message="found again after a lost answer")
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _submit_once(self, body: dict[str, Any]) -> SubmitResult:
        ans = self._call("POST", f"/slurm/{self.api()}/job/submit", body)
        job_id = ans.body.get("job_id")
        if ans.status != 200 or not job_id:  # "errors" may hold notes (2042: held)
            raise BackendError(f"rest: submit: {_errors(ans.body) or f'HTTP {ans.status}'}")
        return SubmitResult(job_id=str(job_id))

    def find_submitted(self, token: str) -> str | None:
        """The id of the token's user's job whose comment is ``token``, or None."""
        ans = self._call("GET", f"/slurm/{self.api()}/jobs")
        if ans.status != 200:
            raise BackendError(f"rest: jobs: HTTP {ans.status} {_errors(ans.body)}")
        for job in ans.body.get("jobs") or []:
            comment = job.get("comment")
            if isinstance(comment, dict):  # v0.0.40+: {"job": ..., "administrator": ...}
                comment = comment.get("job")
            if comment == token and job.get("user_name", self.user) == self.user:
                return str(job.get("array_job_id") or job.get("job_id"))
        return None

    def status(self, job_id: str) -> JobStatus:
        from slurmfm.backends.slurm_cli import _check_job_id

        ans = self._call("GET", f"/slurm/{self.api()}/job/{_check_job_id(job_id)}")
        jobs = ans.body.get("jobs") or []
        if ans.status != 200 or not jobs:
            raise BackendError(f"rest: job {job_id}: {_errors(ans.body) or f'HTTP {ans.status}'}")
        if len(jobs) > 1:
            return array_status([parse_job(j, job_id) for j in jobs])
        return parse_job(jobs[0], job_id)

    def cancel(self, job_id: str) -> None:
        from slurmfm.backends.slurm_cli import _check_job_id

        ans = self._call("DELETE", f"/slurm/{self.api()}/job/{_check_job_id(job_id)}")
        # v0.0.40+ answer 200 and put a job's own failure in "status" (24.11.5: 2017,
        # "Invalid job id specified" for a job that never existed)
        failed = [
            s["error"].get("string") or s["error"].get("message")
            for s in ans.body.get("status") or []
            if isinstance(s, dict) and isinstance(s.get("error"), dict) and s["error"].get("code")
        ]
        detail = _errors(ans.body) or "; ".join(str(f) for f in failed)
        if ans.status != 200 or detail:
            raise BackendError(f"rest: cancel {job_id}: {detail or f'HTTP {ans.status}'}")

    def wait(
        self,
        job_id: str,
        *,
        timeout: float = 3600.0,
        interval: float = 1.0,
        max_interval: float = 60.0,
    ) -> JobStatus:
        """Until the job ended, polling with backoff (:mod:`slurmfm.polling`): each poll is a
        request to slurmrestd."""
        from slurmfm.polling import wait_for_end

        return wait_for_end(
            lambda: self.status(job_id), job_id, timeout=timeout, first=interval, most=max_interval
        )
