"""A team's shared log and checkpoint directory on real Slurm, with two unprivileged users.

``alice`` (the victim) and ``mallory`` (the attacker) share the group ``slurmfm-team``, a
2775 log directory and a 3775 checkpoint root, as on FSx for Lustre. alice submits slurmfm jobs with umask
002 (``sbatch --uid``; the lab runs as root). Before each job mallory plants, for the next job
ids, what the issue's attack used: a runtime directory of her own (0777) with her code in it
(the layout slurmfm used before), a symbolic link to one of alice's private files and a FIFO
as state files, and links into a directory of hers (or FIFOs) as the job's observe and
evidence directories. During the job she tries to replace alice's runtime copy on the node.
Torch is not the subject: the launcher is the torchrun stand-in (tests/standins/torchrun.py).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import SlurmLab, wait_for_text

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
GROUP = "slurmfm-team"
ALICE, MALLORY = "slurmfm-alice", "slurmfm-mallory"

TRAIN = """import os, sys, time
print("trained rank", os.environ.get("RANK"), "runtime", os.environ.get("SLURMFM_RUNTIME"),
      flush=True)
time.sleep(float(os.environ.get("TRAIN_SLEEP", "0")))
"""
EVIL = """import os
open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "PWNED"), "w")
"""


def ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/bash", name], check=True)


@pytest.fixture
def team() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("needs root to run jobs as two users")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    ensure_user(ALICE)
    ensure_user(MALLORY)
    d = Path(tempfile.mkdtemp(prefix="slurmfm-team-", dir="/var/tmp"))
    d.chmod(0o755)
    gid = grp.getgrnam(GROUP).gr_gid
    for sub, mode in (("logs", 0o2775), ("ckpt", 0o3775)):
        (d / sub).mkdir()
        os.chown(d / sub, 0, gid)
        # logs: the team's directory, group-writable, setgid, not sticky; ckpt: the sticky
        # checkpoint root docs/security.md asks for (the job refuses a non-sticky one)
        (d / sub).chmod(mode)
    home = d / "alice"
    home.mkdir()
    os.chown(home, pwd.getpwnam(ALICE).pw_uid, gid)
    home.chmod(0o700)
    (d / "train.py").write_text(TRAIN)
    shutil.copy(REPO / "tests" / "standins" / "torchrun.py", d / "torchrun.py")
    for f in ("train.py", "torchrun.py"):
        (d / f).chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_user(name: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    pw = pwd.getpwnam(name)
    return subprocess.run(
        argv,
        user=pw.pw_uid,
        group=pw.pw_gid,
        umask=0o002,
        text=True,
        capture_output=True,
        check=False,
        **kw,
    )


def render(
    team: Path,
    name: str,
    python: str = "",
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    **storage: str,
) -> str:
    import slurmfm.api as fm

    recipe = fm.load(
        {
            "name": name,
            "cluster": {"instance_type": "lab-cpu", "partition": "batch", "slurm_version": "22.05"},
            "resources": {"nodes": 2, "procs_per_node": 1},
            "launcher": {
                "kind": "torchrun",
                "script": str(team / "train.py"),
                "python": python or str(team / "torchrun.py"),
                "args": args or [],
            },
            "env": env or {},
            "storage": {
                "checkpoint_root": str(team / "ckpt"),
                "log_dir": str(team / "logs"),
                **storage,
            },
            "resilience": {"requeue": False, "health_gate": "off", "save_before_timeout_s": 0},
            # the agents write the job's observe directory (job.json, node files, progress)
            "observability": {
                "enabled": "on",
                "textfile_dir": None,
                "dcgm_job_mapping_dir": None,
                "interval_s": 1,
            },
        }
    )
    return fm.dry_run(recipe, slurm_version="22.05").script.decode()


def another_runtime(script: str) -> str:
    """``script`` with another runtime version embedded: the same modules plus one entry, so
    its bytes and sha256 differ from the renderer's (a teammate on another slurmfm release)."""
    import base64
    import hashlib
    import io
    import zipfile

    from slurmfm.render.payload import MARK, extract

    old = extract(script)
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(old)) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info.filename))
        dst.writestr("slurmfm_job/RELEASE", "an older slurmfm\n")
    new = buf.getvalue()
    old_sha, new_sha = hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest()
    body = script.rstrip("\n").rsplit("\n", 1)[0].replace(old_sha, new_sha)
    assert new_sha in body  # the script's own check names the new runtime
    return f"{body}\n{MARK} sha256={new_sha} {base64.b64encode(new).decode()}\n"


def submit(
    lab: SlurmLab, team: Path, user: str, script: str, sleep: float = 0, chdir: Path | None = None
) -> str:
    path = team / f"{user}-{abs(hash(script)) % 10**8}.sh"
    path.write_text(script)
    path.chmod(0o755)
    env = {
        **lab.env,
        "PATH": "/usr/bin:/bin",
        "TRAIN_SLEEP": str(sleep),
        "HOME": str(team / "alice"),
    }
    proc = lab.run(
        [
            "sbatch",
            "--parsable",
            f"--uid={user}",
            f"--gid={GROUP}",
            "--export=ALL",
            f"--chdir={chdir or team}",
            str(path),
        ],
        env=env,
        preexec_fn=lambda: os.umask(0o002),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def next_ids(lab: SlurmLab, team: Path, count: int = 6) -> list[int]:
    """The next job ids (the lab numbers jobs one by one; this group runs alone on it)."""
    proc = lab.run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "true"])
    assert proc.returncode == 0, proc.stderr
    last = int(proc.stdout.strip().split(";")[0])
    return list(range(last + 1, last + 1 + count))


def run_victim(host_b_lab: SlurmLab, team: Path, ids: list[int], secret: Path) -> str:
    logs = team / "logs"
    victim = submit(host_b_lab, team, ALICE, render(team, "alice-run"), sleep=4)
    assert int(victim) in ids
    out = logs / f"alice-run_{victim}.out"
    wait_for_text(out, "trained rank 0", 120)
    runtime = next(
        line.split("runtime ", 1)[1] for line in out.read_text().splitlines() if "runtime " in line
    )
    assert runtime.startswith(f"/tmp/slurmfm-{victim}-")
    # during the job: mallory cannot replace, rewrite or remove alice's runtime copy
    swap = (
        "import os, sys\n"
        "p = sys.argv[1]\n"
        "open(p + '.evil', 'w').write('print(1)')\n"
        "for f in (lambda: os.replace(p + '.evil', p), lambda: open(p, 'w'),"
        " lambda: os.unlink(p)):\n"
        "    try:\n        f(); print('SWAPPED')\n    except OSError as e:\n        print(e)\n"
        "os.unlink(p + '.evil')\n"
    )
    tried = as_user(MALLORY, ["/usr/bin/python3", "-c", swap, runtime])
    assert "SWAPPED" not in tried.stdout, tried.stdout
    assert tried.stdout.count("Permission denied") + tried.stdout.count("Operation not") == 3
    rec = host_b_lab.wait_job(victim, timeout=120)
    log = out.read_text()
    assert rec.get("JobState") == "COMPLETED", (rec, log)
    assert "ignoring" in log  # the planted state file, said so
    assert not (team / "PWNED").exists()
    assert not (logs / "PWNED").exists()
    assert secret.read_text() == "alice only\n"
    # alice's record: her own file, under a fresh name; nothing she wrote is group-writable
    own = [
        p
        for p in logs.glob(f"alice-run_{victim}.*state")
        if not p.is_symlink() and stat.S_ISREG(p.lstat().st_mode)
    ]
    assert len(own) == 1
    assert own[0].stat().st_uid == pwd.getpwnam(ALICE).pw_uid
    assert "event=start" in own[0].read_text()
    # (the .out file is Slurm's own, made with sbatch's umask: 002 here; `slurmfm submit`
    # submits with 022 added, tests/backends)
    for p in [*logs.iterdir(), *(team / "ckpt").rglob("*")]:
        if p.suffix == ".out":
            continue
        if p.lstat().st_uid == pwd.getpwnam(ALICE).pw_uid and not p.is_symlink():
            assert stat.S_IMODE(p.lstat().st_mode) & 0o022 == 0, p
    return victim


def test_another_users_plants_neither_run_nor_block_nor_redirect_a_job(
    host_b_lab: SlurmLab, team: Path
) -> None:
    logs = team / "logs"
    # alice's private file, the target of mallory's links
    secret = team / "alice" / "secret"
    secret.write_text("alice only\n")
    os.chown(secret, pwd.getpwnam(ALICE).pw_uid, -1)
    secret.chmod(0o600)
    # mallory first runs her own slurmfm job in the same directory, with another runtime
    # version (before: the first user's runtime directory blocked the other's, exit 1)
    mine = another_runtime(render(team, "mallory-run"))
    first = submit(host_b_lab, team, MALLORY, mine)
    assert host_b_lab.wait_job(first, timeout=120).get("JobState") == "COMPLETED"
    # then plants for alice's next jobs
    rt = logs / ".slurmfm-runtime"
    plant = (
        "import os, sys\n"
        f"logs = {str(logs)!r}\n"
        f"rt = {str(rt)!r}\n"
        "os.makedirs(rt, exist_ok=True); os.chmod(rt, 0o777)\n"
        f"open(os.path.join(rt, 'evil.pyz'), 'w').write({EVIL!r})\n"
        f"drop = {str(logs / 'mallory-drop')!r}\n"
        "os.makedirs(drop, exist_ok=True); os.chmod(drop, 0o777)\n"
        "for i, job in enumerate(sys.argv[1:]):\n"
        "    p = os.path.join(logs, 'alice-run_%s.state' % job)\n"
        f"    os.symlink({str(secret)!r}, p) if i % 2 == 0 else os.mkfifo(p)\n"
        # the job's observe and evidence directories: links into her drop, or FIFOs
        "    for kind in ('observe', 'evidence'):\n"
        "        d = os.path.join(logs, 'alice-run_%s.%s' % (job, kind))\n"
        "        os.symlink(drop, d) if i % 2 == 0 else os.mkfifo(d)\n"
    )
    ids = next_ids(host_b_lab, team, 12)
    done = as_user(MALLORY, ["/usr/bin/python3", "-c", plant, *map(str, ids)])
    assert done.returncode == 0, done.stderr
    # alice's jobs until one met the link and one the FIFO (other jobs may take ids between)
    met: set[str] = set()
    for _ in range(4):
        victim = run_victim(host_b_lab, team, ids, secret)
        planted = logs / f"alice-run_{victim}.state"
        met.add("link" if planted.is_symlink() else "fifo" if planted.is_fifo() else "none")
        if {"link", "fifo"} <= met:
            break
    assert {"link", "fifo"} <= met, met
    # nothing of alice's went through mallory's links; her observe directory is her own,
    # under a fresh name, with what the agents wrote
    assert list((logs / "mallory-drop").iterdir()) == []
    alice = pwd.getpwnam(ALICE).pw_uid
    obs = [
        p
        for p in logs.glob(f"alice-run_{victim}.observe*")
        if not p.is_symlink() and p.is_dir() and p.stat().st_uid == alice
    ]
    assert len(obs) == 1, sorted(logs.iterdir())
    assert obs[0].name != f"alice-run_{victim}.observe"  # the planted name was not used
    assert (obs[0] / "job.json").is_file()
    assert sorted(p.name for p in obs[0].glob("node_*_r0.json")), sorted(obs[0].iterdir())
    # slurmfm status reads alice's record and says what it ignored
    status = host_b_lab.slurmfm("status", victim)
    assert status.returncode == 0, status.stderr
    assert "ignored state file" in status.stderr
    assert "not the job's user's" in status.stderr
    assert "restarts" not in status.stdout or "restarts  5" not in status.stdout


SWEEP = """name: sw
cluster: {{instance_type: lab-cpu, partition: batch}}
resources: {{nodes: 1, procs_per_node: 1}}
launcher: {{kind: torchrun, script: {team}/train.py, python: {team}/torchrun.py}}
env: {{TRAIN_SLEEP: "60"}}
storage: {{checkpoint_root: {team}/ckpt, log_dir: {team}/logs}}
resilience: {{requeue: false, save_before_timeout_s: 0}}
observability: {{enabled: "off"}}
sweep:
  parameters: {{env.LR: ["1", "2"]}}
"""


def test_a_plain_job_is_refused_the_directory_a_live_sweep_task_trains_in(
    host_b_lab: SlurmLab, team: Path
) -> None:
    """The run-directory record, keyed on each task's resolved directory, seen by a plain job;
    a link planted as the plain job's record is refused, never written through."""
    recipe = team / "sweep.yaml"
    recipe.write_text(SWEEP.format(team=team))
    proc = host_b_lab.slurmfm("submit", str(recipe))
    assert proc.returncode == 0, proc.stderr
    array = proc.stdout.strip().splitlines()[-1]
    try:
        victim = team / "victim"
        victim.write_text("root only\n")
        victim.chmod(0o600)
        link = team / "sw" / ".sw.slurmfm-jobs"  # the record of <root>/sw/sw
        link.parent.mkdir()
        link.symlink_to(victim)
        # the same directory as sweep task 1, through a symlinked root
        (team / "alias").symlink_to(team / "ckpt")
        plain = host_b_lab.slurmfm(
            "submit",
            str(recipe),
            "--set",
            "sweep=null",
            "--set",
            "storage.run_id=sw-t1",
            "--set",
            f"storage.checkpoint_root={team}/alias",
        )
        assert plain.returncode == 2, (plain.stdout, plain.stderr)
        assert f"job {array}" in plain.stderr
        assert "sw-t1" in plain.stderr
        # a plain job whose record is a planted link: refused with one line (before: submitted
        # with the one-job check silently off), the link's target untouched
        refused = host_b_lab.slurmfm(
            "submit",
            str(recipe),
            "--set",
            "sweep=null",
            "--set",
            "storage.run_id=sw",
            "--set",
            f"storage.checkpoint_root={team}",
        )
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert "the run record" in refused.stderr
        assert "symbolic link" in refused.stderr
        assert victim.read_text() == "root only\n"
        link.unlink()
        ok = host_b_lab.slurmfm(
            "submit",
            str(recipe),
            "--set",
            "sweep=null",
            "--set",
            "storage.run_id=sw",
            "--set",
            f"storage.checkpoint_root={team}",
            "--set",
            "env.TRAIN_SLEEP=0",
        )
        assert ok.returncode == 0, ok.stderr
        assert victim.read_text() == "root only\n"
        host_b_lab.wait_job(ok.stdout.strip().splitlines()[-1], timeout=120)
    finally:
        host_b_lab.run(["scancel", array])
        # until its tasks have ended: the team fixture then removes the directory they write
        # into (a cancelled task still writing left team dirs behind in /var/tmp)
        with contextlib.suppress(TimeoutError):
            host_b_lab.wait_job(array, timeout=120)


# Issue 38: the working directory and the run directory's chain, in real jobs of alice's.
STUB_TORCHRUN = """import runpy, sys
sys.argv[0] = {standin!r}
runpy.run_path({standin!r}, run_name="__main__")
"""
PLANT_TORCH = """import os, sys
for sub in ("torch", "torch/distributed"):
    os.makedirs(os.path.join(sys.argv[1], sub), exist_ok=True)
    with open(os.path.join(sys.argv[1], sub, "__init__.py"), "w") as fh:
        fh.write("open(%r, 'w').write('mallory')\\n" % os.path.join(sys.argv[1], "PWNED"))
"""


def test_a_package_planted_in_the_working_directory_never_runs_in_the_job(
    host_b_lab: SlurmLab, team: Path
) -> None:
    """mallory plants ``torch/`` in the team directory alice's job runs in (2775); the job's
    ``python3 -c RUN_MODULE torch.distributed.run`` imports alice's torch (here the torchrun
    stand-in under alice's ``PYTHONPATH``, where site-packages would be). Before: ``python3 -m
    torch.distributed.run`` imported mallory's from the working directory, as alice."""
    logs = team / "logs"
    lib = team / "alice" / "lib" / "torch" / "distributed"
    lib.mkdir(parents=True)
    (lib.parent / "__init__.py").write_text("")
    (lib / "__init__.py").write_text("")
    (lib / "run.py").write_text(STUB_TORCHRUN.format(standin=str(team / "torchrun.py")))
    for p in [team / "alice", *(team / "alice").rglob("*")]:
        os.chown(p, pwd.getpwnam(ALICE).pw_uid, -1)
        p.chmod(0o755 if p.is_dir() else 0o644)
    planted = as_user(MALLORY, ["/usr/bin/python3", "-c", PLANT_TORCH, str(logs)])
    assert planted.returncode == 0, planted.stderr
    script = render(
        team, "wd-run", python="/usr/bin/python3", env={"PYTHONPATH": str(team / "alice" / "lib")}
    )
    job = submit(host_b_lab, team, ALICE, script, chdir=logs)
    rec = host_b_lab.wait_job(job, timeout=120)
    out = (logs / f"wd-run_{job}.out").read_text()
    assert not (logs / "PWNED").exists(), out  # before: mallory's torch ran as alice
    assert rec.get("JobState") == "COMPLETED", (rec, out)
    assert "trained rank 0" in out


def test_the_job_refuses_a_run_directory_that_is_a_link_to_another_of_my_runs(
    host_b_lab: SlurmLab, team: Path
) -> None:
    """alice's ``<root>/<name>/<run_id>`` is a link to another of her runs (no race needed):
    the job refuses to save into or resume from it. Before: every check passed, and the new
    run resumed the other model's weights and wrote over its newest step."""
    ckpt = team / "ckpt"
    make = (
        "import os, sys\n"
        "root = sys.argv[1]\n"
        "os.makedirs(root + '/gpt/gpt/step_000000007')\n"
        "open(root + '/gpt/gpt/latest', 'w').write('step_000000007\\n')\n"
        "os.makedirs(root + '/link-run')\n"
        "os.symlink(root + '/gpt/gpt', root + '/link-run/link-run')\n"
    )
    made = as_user(ALICE, ["/usr/bin/python3", "-c", make, str(ckpt)])
    assert made.returncode == 0, made.stderr
    job = submit(host_b_lab, team, ALICE, render(team, "link-run"))
    rec = host_b_lab.wait_job(job, timeout=120)
    out = (team / "logs" / f"link-run_{job}.out").read_text()
    assert rec.get("JobState") == "FAILED", (rec, out)
    assert "refusing to save or resume there" in out, out
    assert "is a symbolic link" in out, out
    assert "resuming from" not in out
    assert sorted(os.listdir(ckpt / "gpt" / "gpt")) == ["latest", "step_000000007"]


def test_logs_and_report_show_only_my_files_and_no_escapes(
    host_b_lab: SlurmLab, team: Path
) -> None:
    """mallory plants ``NAME_JOB_r7.out`` and ``nccl-JOB-r0-*`` for alice's next job ids;
    alice's training prints an OSC 52 clipboard write, and her token is on its launch line.
    The job log never shows the token; ``slurmfm logs`` and ``report`` show
    alice's output only, say what they ignored, and print the escape as text (``--raw``: as
    written). Before: "== restart 7 ==" with mallory's text, "NCCL: socket", and the escape
    sent to the terminal."""
    logs = team / "logs"
    (team / "train.py").write_text(TRAIN + 'print("clip \\x1b]52;c;cGF5bG9hZA==\\x07 end")\n')
    ids = next_ids(host_b_lab, team, 6)
    plant = (
        "import sys\n"
        f"logs = {str(logs)!r}\n"
        "for job in sys.argv[1:]:\n"
        "    open('%s/log-run_%s_r7.out' % (logs, job), 'w').write('mallory restart 7\\n')\n"
        "    open('%s/nccl-%s-r0-aaa-1.log' % (logs, job), 'w').write("
        "'NCCL INFO NET/Socket : Using [0]eth0\\nNCCL INFO Using network Socket\\n')\n"
    )
    planted = as_user(MALLORY, ["/usr/bin/python3", "-c", plant, *map(str, ids)])
    assert planted.returncode == 0, planted.stderr
    token = "hf_" + "tok3n" * 6  # under env: (validate warns), and on the launch line
    script = render(team, "log-run", env={"HF_TOKEN": token}, args=["--token", token])
    job = submit(host_b_lab, team, ALICE, script)
    assert int(job) in ids
    rec = host_b_lab.wait_job(job, timeout=120)
    assert rec.get("JobState") == "COMPLETED", rec
    out = (logs / f"log-run_{job}.out").read_text()
    assert "launch: " in out
    assert "node 0 runs: " in out
    assert token not in out  # before: "node 0 runs: ... --token hf_..." in the team's log
    assert "--token '<secret>'" in out
    shown = host_b_lab.slurmfm("logs", job)
    assert shown.returncode == 0, shown.stderr
    assert "mallory" not in shown.stdout
    assert "== restart 7 ==" not in shown.stdout
    assert f"log-run_{job}_r7.out (uid {pwd.getpwnam(MALLORY).pw_uid})" in shown.stderr
    assert "\x1b" not in shown.stdout
    assert "clip \\x1b]52;c;cGF5bG9hZA==\\x07 end" in shown.stdout
    raw = host_b_lab.slurmfm("logs", job, "--raw")
    assert "clip \x1b]52;c;cGF5bG9hZA==\x07 end" in raw.stdout
    report = host_b_lab.slurmfm("report", job)
    assert report.returncode == 0, report.stderr
    assert "socket" not in report.stdout.split("logs:")[0].lower(), report.stdout
    assert f"nccl-{job}-r0-aaa-1.log (uid {pwd.getpwnam(MALLORY).pw_uid})" in report.stdout
