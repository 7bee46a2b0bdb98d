"""Shared pytest fixtures, and the test tiers. Real-Slurm lab access lives in tests/lab.py.

Tiers are set from the fixtures a test uses, never by hand, so that a new test lands in the
right tier by what it does (``scripts/run-tests`` runs them in this order):

* ``real``: it uses a lab (``slurm_lab``, ``slurm_lab_suite``, ``each_lab``, ``every_lab``, or
  a fixture declared with :func:`lab.own_lab_fixture`). It also gets one ``xdist_group`` per
  lab, so that with ``pytest -n N --dist loadgroup`` a lab is never driven by two workers at
  once (``scripts/run-tests`` runs the real tier that way).
* ``script``: it runs a rendered job under stand-ins (a fixture in :data:`SCRIPT_FIXTURES`).
* ``unit``: everything else.

``pytest -m unit``, ``-m script`` and ``-m real`` select a tier.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from lab import (
    GROUP_SECONDS,
    HOST_B,
    HOST_C,
    SUITES,
    SlurmLab,
    SuiteLabFactory,
    host_lab,
    lab_requested,
    lab_root,
    own_lab_fixture,
    suite_lab_factory,
)

# Property tests judge behaviour, never wall-clock time: hypothesis' default deadline (200 ms
# per example) failed a pure round-trip test on a machine whose two cores were busy with the
# labs (tests/observe/test_agent.py::test_values_round_trip, 2026-12-06). A test's own
# @settings(deadline=...) still applies.
settings.register_profile("slurmfm", deadline=None)
settings.load_profile("slurmfm")

# Signals whose disposition the job runtime's code sets for its own process (the node entry
# ignores USR2 for its launcher, handles TERM): a test that runs that code in the pytest
# worker must not leave it so, or every later test's subprocess inherits SIG_IGN across exec
# (a check that the save signal kills a non-launch step then passed its process a USR2 it
# ignored: tests/job/test_shared_files.py, in a CI simulation).
_KEPT_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signals_as_they_were() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in _KEPT_SIGNALS}
    yield
    for s, handler in before.items():
        if signal.getsignal(s) is not handler:
            signal.signal(s, handler)


# Fixtures that hand a test one of the run's shared labs; the group is the suite.
SHARED_LAB_FIXTURES = frozenset({"slurm_lab", "slurm_lab_suite", "each_lab", "every_lab"})
# Fixtures that build a stand-in cluster (fake srun/scontrol/torchrun on PATH) for the job.
SCRIPT_FIXTURES = frozenset({"cluster", "sandbox"})
TIERS = ("unit", "script", "real")


def _own_lab_names(item: pytest.Item) -> tuple[str, ...]:
    """The OwnLabs the item drives, from its fixtures' declarations (lab.own_lab_fixture): the
    one lab of a fixture, or, of a fixture with one lab per suite, the test's ``suite``."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return ()
    params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
    names: set[str] = set()
    for name in item.fixturenames:  # type: ignore[attr-defined]
        for fixturedef in info.name2fixturedefs.get(name, ()):
            by_suite: dict[str, str] = getattr(fixturedef.func, "slurmfm_own_labs", {})
            if len(by_suite) == 1:
                names.update(by_suite.values())
            elif by_suite:
                suite = params.get("suite")
                if not isinstance(suite, str) or suite not in by_suite:
                    raise pytest.UsageError(
                        f"{item.nodeid}: fixture {name} brings up one lab per suite "
                        f"({', '.join(sorted(by_suite))}); parametrize the test with `suite` "
                        "so that its xdist group names the lab it drives"
                    )
                names.add(by_suite[suite])
    return tuple(sorted(names))


def _shared_suite(item: pytest.Item) -> str:
    """The shared lab a test drives: the suite of its lab fixture's parameter, else the host."""
    params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
    for key in ("every_lab", "each_lab", "suite"):
        value = params.get(key)
        if isinstance(value, str) and value in SUITES:
            return value
    return "host"


def tier_and_group(item: pytest.Item) -> tuple[str, str | None]:
    """The item's tier and, for the real tier, its xdist group (one per lab)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    own = _own_lab_names(item)
    if own:
        return "real", "+".join(own)
    if fixtures & SHARED_LAB_FIXTURES:
        suite = _shared_suite(item)
        if suite == "host" and item.get_closest_marker("host_c") is not None:
            return "real", HOST_C.name
        return "real", f"shared-{suite}"
    if fixtures & SCRIPT_FIXTURES:
        return "script", None
    return "unit", None


_CACHE_KEY = pytest.StashKey[str]()
_HISTORY_KEY = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: test tier, set from the fixtures it uses")
    config.addinivalue_line(
        "markers",
        "host_c: the host variant of this test runs on the third host lab (HOST_C), not on the "
        "shared host lab",
    )
    config.addinivalue_line(
        "markers",
        "last_in_group: run after the other tests of its lab's xdist group (a test that waits "
        "for a background build of scripts/run-tests, so that its worker does not wait idle)",
    )
    # Every run (and every xdist worker) renders into a render cache of its own. Why: the CLI's
    # cache (slurmfm/render_cache.py) defaults to ~/.cache, shared by every checkout and run on
    # the machine, so a test could read another run's entry and a run would leave files in the
    # user's home. Set before collection, so that subprocesses and module-level code see it.
    # A chroot lab sees only its root's scratch dir of the host's disk (scripts/slurm-lab), so
    # when the run asked for labs, the tests' tmp_path lives there: jobs write their logs and
    # checkpoints into it. xdist workers get their own subdirectories of the controller's.
    if (
        lab_requested()
        and config.option.basetemp is None
        and "PYTEST_XDIST_WORKER" not in os.environ
    ):
        scratch = lab_root() / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)  # slurm-lab makes it too, for chroot labs
        config.option.basetemp = str(scratch / "pytest")
    cache = tempfile.mkdtemp(prefix="slurmfm-test-cache-")
    config.stash[_CACHE_KEY] = cache
    os.environ["SLURMFM_CACHE_DIR"] = cache
    # Every submission is recorded in the user's history (slurmfm.history). Each run (and
    # each xdist worker) records into a history of its own, not the home directory of whoever
    # runs the suite, and not one kept from run to run: the labs number their jobs the same
    # way in every run and the tests' directories have the same names, so an earlier run's
    # submissions looked like this run's (a ledger read one job's state file twice).
    history = tempfile.mkdtemp(prefix="slurmfm-test-history-")
    config.stash[_HISTORY_KEY] = history
    os.environ["SLURMFM_HISTORY"] = os.path.join(history, "history.jsonl")


_TRACKED_KEY = pytest.StashKey[dict[str, int]]()
REPO_ROOT = Path(__file__).resolve().parent.parent


def _tracked_mtimes() -> dict[str, int]:
    """mtime of every file git tracks in this checkout (empty outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "ls-files", "-z"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    mtimes: dict[str, int] = {}
    for name in out.decode().split("\0"):
        if name:
            with contextlib.suppress(OSError):
                mtimes[name] = (REPO_ROOT / name).stat().st_mtime_ns
    return mtimes


def pytest_sessionstart(session: pytest.Session) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        session.config.stash[_TRACKED_KEY] = _tracked_mtimes()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test changed a tracked file, even only its mtime.

    Why: tests run in parallel and beside other checkouts' runs; a test that edits the checkout
    (once: a template's mtime, to change the render cache's key) makes another test see a
    changed package, and leaves a dirty tree behind when it dies halfway.
    """
    before = session.config.stash.get(_TRACKED_KEY, None)
    if not before:
        return
    after = _tracked_mtimes()
    changed = sorted(name for name, mtime in before.items() if after.get(name, mtime) != mtime)
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = (
            "tracked files changed while the tests ran (a test must write under tmp_path; "
            "or were they edited meanwhile?): " + ", ".join(changed[:20])
        )
        if reporter is not None:
            reporter.write_line(msg, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    for key in (_CACHE_KEY, _HISTORY_KEY):
        made = config.stash.get(key, None)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _put_in_group(item: pytest.Item, group: str) -> None:
    """Give an xdist worker's item the ``@group`` node id suffix that ``--dist loadgroup``
    schedules by.

    Why here: xdist writes the suffix into ``item._nodeid``, which pytest 9.2 no longer reads
    (node ids are structured, ``item._id``), so the groups are silently ignored and a lab gets
    driven by two workers at once (pytest-dev/pytest-xdist#1386, fix pending in #1388).
    """
    node_id = getattr(item, "_id", None)  # absent before pytest 9.2, where xdist's own works
    if node_id is not None and not item.nodeid.endswith(f"@{group}"):
        item._id = type(node_id).parse(f"{item.nodeid}@{group}")


def _write_real_files(files: set[str]) -> None:
    """Write the files that hold real-tier tests to $SLURMFM_REAL_FILES_OUT, one per line.

    Why: scripts/run-tests has the unit tier (which collects every test anyway) name them, and
    its real tier then collects only those (:func:`pytest_ignore_collect`), at the real tier's
    start, when six workers and the labs want the two cores at once. Written whole or not at
    all (both unit workers write the same list).
    """
    out = os.environ.get("SLURMFM_REAL_FILES_OUT")
    if not out:
        return
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(f"{name}\n" for name in sorted(files))
    os.replace(tmp, out)


@functools.cache
def _real_files(listed: str) -> frozenset[str]:
    return frozenset(Path(listed).read_text(encoding="utf-8").splitlines())


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With $SLURMFM_REAL_FILES (the unit tier's list, :func:`_write_real_files`), a test
    file that holds no real-tier test is not imported: scripts/run-tests' real tier selects
    ``-m real``, so such a file would only be collected to be deselected."""
    listed = os.environ.get("SLURMFM_REAL_FILES")
    if not listed or collection_path.suffix != ".py" or not collection_path.is_file():
        return None
    return None if str(collection_path) in _real_files(listed) else True


@pytest.hookimpl(tryfirst=True)  # before xdist reads xdist_group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    loadgroup = bool(getattr(config.option, "loadgroup", False))  # set on xdist workers only
    groups: dict[int, str | None] = {}
    real_files: set[str] = set()
    for item in items:
        tier, group = tier_and_group(item)
        groups[id(item)] = group
        if tier == "real":
            real_files.add(str(item.path))
        item.add_marker(getattr(pytest.mark, tier))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if loadgroup:
                _put_in_group(item, group)
    _write_real_files(real_files)
    if loadgroup:  # stable: tests keep their order within a group, but last_in_group's last
        items.sort(
            key=lambda it: (
                -GROUP_SECONDS.get(groups.get(id(it)) or "", 0),
                it.get_closest_marker("last_in_group") is not None,
            )
        )


@pytest.fixture
def slurm_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """The running Slurm lab ($SLURMFM_LAB, else $SLURMFM_LAB_ROOT/host); for a test marked
    ``host_c``, the third host lab (``HOST_C``)."""
    if request.node.get_closest_marker("host_c") is not None:
        lab: SlurmLab = request.getfixturevalue("host_c_lab")
        return lab
    return host_lab()


@pytest.fixture(scope="session")
@own_lab_fixture(HOST_B)
def host_b_lab() -> SlurmLab:
    """The second host lab (``HOST_B``), brought up on first use."""
    return HOST_B.up()


@pytest.fixture(scope="session")
def host_c_lab() -> SlurmLab:
    """The third host lab (``HOST_C``), brought up on first use. Its group comes from the
    ``host_c`` marker (:func:`tier_and_group`), not from this fixture, which the tests request
    through ``slurm_lab``."""
    return HOST_C.up()


@pytest.fixture(scope="session")
def slurm_lab_suite() -> SuiteLabFactory:
    """Call with "trixie" or "sid": the running chroot lab of that suite."""
    return suite_lab_factory()


@pytest.fixture(params=["host", "trixie"])
def each_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """The host lab (Slurm 22.05 on Debian 12) and the trixie lab (24.11), when requested."""
    if request.param == "host":
        lab: SlurmLab = request.getfixturevalue("slurm_lab")
        return lab
    factory: SuiteLabFactory = request.getfixturevalue("slurm_lab_suite")
    return factory(request.param)


@pytest.fixture(params=["host", "trixie", "sid"])
def every_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """Each Slurm the project runs: 22.05 (host), 24.11 (trixie) and 26.05 (sid); the chroot
    suites when ``SLURMFM_LAB_SUITES`` names them (``scripts/run-tests`` does)."""
    if request.param == "host":
        lab: SlurmLab = request.getfixturevalue("slurm_lab")
        return lab
    factory: SuiteLabFactory = request.getfixturevalue("slurm_lab_suite")
    return factory(request.param)
