"""NCCL/EFA profiles: every rule on and off, version gates at their boundaries, invariants."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from slurmfm.catalog.instances import INSTANCES, InstanceType
from slurmfm.catalog.nccl import (
    FORBIDDEN,
    LEGACY_ONLY,
    RULES,
    EnvSetting,
    JobTraits,
    Rule,
    Runtime,
    StackVersions,
    check_minimums,
    is_forbidden,
    merge_env,
    nccl_env,
    user_env_warnings,
)

RUNTIMES: tuple[Runtime, ...] = ("host", "container")
AUTO = StackVersions()
PREPEND = "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"


def I(name: str) -> InstanceType:  # noqa: E743 - short name keeps the tables readable
    return INSTANCES[name]


def S(**versions: str) -> StackVersions:
    return StackVersions.parse(**versions)


def env_dict(instance: str, stack: StackVersions, runtime: Runtime) -> dict[str, str]:
    return {s.name: s.value for s in nccl_env(I(instance), stack, runtime)}


RULE_BY_ID = {r.id: r for r in RULES}

# rule id, (instance, stack, runtime) where it applies, (...) where it does not,
# and the settings it must contribute to nccl_env when it applies.
RULE_CASES: list[
    tuple[
        str,
        tuple[str, StackVersions, Runtime],
        tuple[str, StackVersions, Runtime],
        dict[str, str],
    ]
] = [
    (
        "efa-provider",
        ("p5.48xlarge", AUTO, "host"),
        ("lab-cpu", AUTO, "host"),
        {"FI_PROVIDER": "efa"},
    ),
    (
        "socket-ifname",
        ("p6-b300.48xlarge", AUTO, "container"),
        ("lab-cpu", AUTO, "container"),
        {"NCCL_SOCKET_IFNAME": "^docker,lo,veth"},
    ),
    (
        "nccl-debug-warn",
        ("p4d.24xlarge", AUTO, "host"),
        ("lab-cpu", AUTO, "host"),
        {"NCCL_DEBUG": "WARN"},
    ),
    (
        "plugin-path-legacy",
        ("p4d.24xlarge", S(efa_installer="1.35.9"), "container"),
        ("p4d.24xlarge", S(efa_installer="1.36.0"), "container"),
        {"LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/install/lib:/opt/amazon/efa/lib" + PREPEND},
    ),
    (
        "ofi-le-1.5-provider",
        ("p4d.24xlarge", S(aws_ofi_nccl="1.5.0"), "host"),
        ("p4d.24xlarge", S(aws_ofi_nccl="1.6.0"), "host"),
        {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"},
    ),
    (
        "ofi-lt-1.7-device-rdma",
        ("p5.48xlarge", S(aws_ofi_nccl="1.6.3"), "host"),
        ("p5.48xlarge", S(aws_ofi_nccl="1.7.0"), "host"),
        {"FI_EFA_USE_DEVICE_RDMA": "1"},
    ),
    (
        "efa-lt-1.29.1-cuda-sync-memops",
        ("p5.48xlarge", S(efa_installer="1.29.0", nccl="2.19.3-1"), "host"),
        ("p5.48xlarge", S(efa_installer="1.29.1", nccl="2.19.3-1"), "host"),
        {"FI_EFA_SET_CUDA_SYNC_MEMOPS": "0"},
    ),
    (
        "nvls-permuted-devices",
        ("p5en.48xlarge", AUTO, "host"),
        ("p5en.48xlarge", S(nccl="2.21.5"), "host"),
        {"NCCL_NVLS_ENABLE": "0"},
    ),
]
PERMUTED = JobTraits(cuda_visible_devices="0,4,2,6,1,5,3,7")


def test_every_rule_has_cases_and_unique_id() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    assert {c[0] for c in RULE_CASES} == set(ids)


@pytest.mark.parametrize(("rule_id", "on", "off", "expected"), RULE_CASES)
def test_rule_applies_and_does_not(
    rule_id: str,
    on: tuple[str, StackVersions, Runtime],
    off: tuple[str, StackVersions, Runtime],
    expected: dict[str, str],
) -> None:
    rule = RULE_BY_ID[rule_id]
    assert rule.applies(I(on[0]), on[1], on[2]) is True
    assert rule.applies(I(off[0]), off[1], off[2]) is False
    produced = {s.name: s.value for s in rule.settings(I(on[0]), on[1], on[2])}
    assert produced == expected
    env = {s.name: s.value for s in nccl_env(I(on[0]), on[1], on[2], PERMUTED)}
    for name, value in expected.items():
        assert env[name] == value


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_metadata(rule: Rule) -> None:
    assert rule.source.strip()
    assert rule.description.strip()
    if not rule.verified:
        assert "unverified" in rule.description.lower()


def test_modern_default_profile_is_minimal() -> None:
    env = env_dict("p5.48xlarge", AUTO, "host")
    assert list(env) == ["FI_PROVIDER", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG"]


def test_modern_explicit_versions_same_as_auto() -> None:
    modern = S(efa_installer="1.47.0", libfabric="2.1", aws_ofi_nccl="1.16.3", nccl="2.27.7-1")
    for name in INSTANCES:
        for rt in RUNTIMES:
            assert nccl_env(I(name), modern, rt) == nccl_env(I(name), AUTO, rt)


# --- version gates: just below / at / above ---------------------------------------------------
@pytest.mark.parametrize(
    ("ofi", "proto", "device_rdma"),
    [
        ("1.4.0", True, True),
        ("1.5.0", True, True),  # <= 1.5.0: FI_PROVIDER + NCCL_PROTO
        ("1.6.0", False, True),  # 1.6.x: FI_EFA_USE_DEVICE_RDMA only
        ("1.6.9", False, True),
        ("1.7.0", False, False),  # >= 1.7.0: neither
        ("1.7.2", False, False),
        ("1.16.3", False, False),
        ("v1.6.1", False, True),
        ("1.7.0rc1", False, False),  # compared on release numbers: 1.7.0rc1 counts as 1.7.0
    ],
)
def test_ofi_gates_on_p4_p5(ofi: str, proto: bool, device_rdma: bool) -> None:
    for name in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"):
        env = env_dict(name, S(aws_ofi_nccl=ofi), "host")
        assert ("NCCL_PROTO" in env) is proto
        assert ("FI_EFA_USE_DEVICE_RDMA" in env) is device_rdma
        assert env["FI_PROVIDER"] == "efa"


@pytest.mark.parametrize("name", ["p6-b200.48xlarge", "p6-b300.48xlarge", "p6e-gb200.36xlarge"])
def test_ofi_legacy_flags_not_on_p6(name: str) -> None:
    env = env_dict(name, S(aws_ofi_nccl="1.5.0"), "host")
    assert "NCCL_PROTO" not in env
    assert "FI_EFA_USE_DEVICE_RDMA" not in env


@pytest.mark.parametrize(
    ("efa", "nccl", "expected"),
    [
        ("1.28.0", "2.19.0", True),
        ("1.29.0", "2.19.0", True),  # just below 1.29.1
        ("1.29.1", "2.19.0", False),  # at
        ("1.29.2", "2.19.0", False),  # above
        ("1.29.0", "2.18.6", False),  # NCCL just below 2.19
        ("1.29.0", "2.19.3-1", True),
        ("1.29.0", "2.20.0", True),
        ("1.29.0", "auto", True),  # unknown NCCL assumed current
        ("auto", "2.19.0", False),  # unknown EFA assumed current
    ],
)
def test_cuda_sync_memops_gate(efa: str, nccl: str, expected: bool) -> None:
    env = env_dict("p5.48xlarge", S(efa_installer=efa, nccl=nccl), "host")
    assert ("FI_EFA_SET_CUDA_SYNC_MEMOPS" in env) is expected


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("efa", ["auto", "1.36.0", "1.36.1", "1.48.0"])
def test_bundled_plugin_path_is_left_to_the_loader(efa: str, runtime: Runtime) -> None:
    """Issue 12.14: every aws-ofi-nccl package registers its directory in
    /etc/ld.so.conf.d/100_ofinccl.conf, and the directory differs by version and distribution
    (lib/<arch>-linux-gnu up to 1.16 on Ubuntu, lib from 1.17, lib64 on RPM, another prefix in
    NGC images): the profile sets no LD_LIBRARY_PATH, so it cannot shadow the right one."""
    for name in INSTANCES:
        env = {s.name for s in nccl_env(I(name), S(efa_installer=efa), runtime)}
        assert "LD_LIBRARY_PATH" not in env
    rule_ids = {r.id for r in RULES}
    assert not {"plugin-path-host", "plugin-path-container"} & rule_ids


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_legacy_source_built_plugin_still_on_the_path(runtime: Runtime) -> None:
    """A source-built plugin (EFA installer < 1.36) has no ld.so.conf.d entry."""
    (ld,) = [s for s in nccl_env(I("p5.48xlarge"), S(efa_installer="1.35.0"), runtime)
             if s.name == "LD_LIBRARY_PATH"]  # fmt: skip
    assert ld.value.startswith("/opt/aws-ofi-nccl/install/lib:")
    assert ld.raw_shell is True
    assert ld.value.endswith(":/opt/amazon/efa/lib" + PREPEND)


# --- LD_LIBRARY_PATH really prepends ------------------------------------------------------------
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    ("existing", "suffix"),
    [(None, ""), ("", ""), ("/usr/local/cuda/lib64", ":/usr/local/cuda/lib64")],
)
def test_ld_library_path_prepends_in_bash(
    runtime: Runtime, existing: str | None, suffix: str
) -> None:
    legacy = S(efa_installer="1.35.0")
    (ld,) = [s for s in nccl_env(I("p5.48xlarge"), legacy, runtime) if s.name == "LD_LIBRARY_PATH"]
    setup = "unset LD_LIBRARY_PATH" if existing is None else f"LD_LIBRARY_PATH='{existing}'"
    script = f'{setup}; export LD_LIBRARY_PATH="{ld.value}"; printf %s "$LD_LIBRARY_PATH"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    # No trailing empty entry (an empty entry would mean "current directory" to ld.so).
    assert out == f"/opt/aws-ofi-nccl/install/lib:/opt/amazon/efa/lib{suffix}"


# --- lab-cpu -----------------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    "stack",
    [AUTO, S(aws_ofi_nccl="1.4.0", efa_installer="1.20.0", nccl="2.19.0")],
)
def test_lab_cpu_gets_no_nccl_env(runtime: Runtime, stack: StackVersions) -> None:
    assert nccl_env(I("lab-cpu"), stack, runtime) == ()
    assert check_minimums(I("lab-cpu"), stack) == []


# --- bug workarounds scoped to their triggers (issue 12.9) / GB200 (issue 12.4) -------------
@pytest.mark.parametrize("name", [n for n, i in INSTANCES.items() if i.gpus and not i.virtual])
def test_no_instance_gets_nvls_or_cumem_off_by_default(name: str) -> None:
    """p5en used to get NCCL_NVLS_ENABLE=0 and NCCL_CUMEM_ENABLE=0 for every job."""
    for rt in RUNTIMES:
        env = env_dict(name, AUTO, rt)
        assert "NCCL_NVLS_ENABLE" not in env
        assert "NCCL_CUMEM_ENABLE" not in env


@pytest.mark.parametrize(
    ("devices", "nccl", "expected"),
    [
        ("0,4,2,6,1,5,3,7", "auto", True),  # the permutation of NVIDIA/nccl#1906
        ("1,0", "2.26.2", True),  # the release the issue reports
        ("1,0", "2.22.0", True),  # first release after the last known good 2.21.5
        ("1,0", "2.21.5", False),  # last known good
        ("0,1,2,3,4,5,6,7", "auto", False),  # ascending: no trigger
        ("3", "auto", False),
        ("GPU-a,GPU-b", "auto", False),  # UUIDs: no index order
        (None, "auto", False),  # Slurm's own binding is ascending
    ],
)
def test_nvls_workaround_gate(devices: str | None, nccl: str, expected: bool) -> None:
    traits = JobTraits(cuda_visible_devices=devices)
    for name in ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "p6e-gb200.36xlarge"):
        env = {s.name: s for s in nccl_env(I(name), S(nccl=nccl), "container", traits)}
        assert ("NCCL_NVLS_ENABLE" in env) is expected
        if expected:
            assert env["NCCL_NVLS_ENABLE"].value == "0"
            assert "https://github.com/NVIDIA/nccl/issues/1906" in env["NCCL_NVLS_ENABLE"].source
    assert nccl_env(I("lab-cpu"), AUTO, "host", PERMUTED) == ()
    rule = RULE_BY_ID["nvls-permuted-devices"]
    assert rule.trigger is not None
    assert "CUDA_VISIBLE_DEVICES" in rule.trigger_text


@pytest.mark.parametrize(
    ("pp", "nodes", "warned"),
    [(4, 16, True), (2, 2, True), (1, 16, False), (4, 1, False)],
)
def test_cumem_off_warns_only_with_internode_send_recv(pp: int, nodes: int, warned: bool) -> None:
    """NVIDIA/nccl#1721: NCCL_CUMEM_ENABLE=0 hangs multi-node send/recv (pipeline stages)."""
    traits = JobTraits(pipeline_parallel=pp, nodes=nodes)
    out = user_env_warnings(I("p5en.48xlarge"), AUTO, "host", {"NCCL_CUMEM_ENABLE": "0"}, traits)
    assert any("issues/1721" in w for w in out) is warned
    assert not user_env_warnings(
        I("p5en.48xlarge"), AUTO, "host", {"NCCL_CUMEM_ENABLE": "1"}, traits
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_gb200_gets_no_nccl_default_restated(runtime: Runtime) -> None:
    """NCCL_MNNVL_ENABLE=1 and NCCL_NVLS_ENABLE=1 restate NCCL's defaults (NCCL env docs), and
    MNNVL_ENABLE=1 also forces the MNNVL check on single-node communicators."""
    env = env_dict("p6e-gb200.36xlarge", AUTO, runtime)
    assert "NCCL_MNNVL_ENABLE" not in env
    assert "NCCL_NVLS_ENABLE" not in env
    assert "gb200-mnnvl" not in RULE_BY_ID
    assert I("p6e-gb200.36xlarge").needs_imex is True
    assert not any(i.needs_imex for n, i in INSTANCES.items() if n != "p6e-gb200.36xlarge")


# --- ordering / duplicates ----------------------------------------------------------------------
def test_later_rule_wins_at_first_position() -> None:
    out = nccl_env(I("p4d.24xlarge"), S(aws_ofi_nccl="1.5.0"), "host")
    names = [s.name for s in out]
    assert len(names) == len(set(names))
    assert names[0] == "FI_PROVIDER"
    assert "aws-ofi-nccl <= 1.5" in out[0].reason  # the legacy rule's reason replaced the default


def test_deterministic() -> None:
    stack = S(aws_ofi_nccl="1.6.0", efa_installer="1.28.0")
    assert nccl_env(I("p5.48xlarge"), stack, "host") == nccl_env(I("p5.48xlarge"), stack, "host")


def test_bad_runtime() -> None:
    with pytest.raises(ValueError, match="runtime"):
        nccl_env(I("p5.48xlarge"), AUTO, "docker")  # type: ignore[arg-type]


# --- forbidden never emitted --------------------------------------------------------------------
_GRID_VERSIONS = {
    "efa_installer": ["auto", "1.20.0", "1.29.0", "1.29.1", "1.35.0", "1.36.0", "1.48.0"],
    "aws_ofi_nccl": ["auto", "1.4.0", "1.5.0", "1.6.2", "1.7.0", "1.16.3"],
    "nccl": ["auto", "2.18.5", "2.19.0", "2.30.4-1"],
}
_GRID = [
    S(efa_installer=e, aws_ofi_nccl=o, nccl=n)
    for e, o, n in itertools.product(*_GRID_VERSIONS.values())
]


@pytest.mark.parametrize("forbidden", sorted(FORBIDDEN))
def test_forbidden_never_emitted(forbidden: str) -> None:
    for name, stack, rt in itertools.product(INSTANCES, _GRID, RUNTIMES):
        emitted = {s.name for s in nccl_env(I(name), stack, rt)}
        assert forbidden not in emitted
        assert not any(is_forbidden(n) for n in emitted)


@pytest.mark.parametrize("legacy", sorted(LEGACY_ONLY))
def test_legacy_only_absent_on_current_stacks(legacy: str) -> None:
    modern = S(efa_installer="1.48.0", aws_ofi_nccl="1.19.0", nccl="2.30.4")
    for name, stack, rt in itertools.product(INSTANCES, (AUTO, modern), RUNTIMES):
        assert legacy not in {s.name for s in nccl_env(I(name), stack, rt)}


def test_forbidden_and_legacy_entries_cite_sources() -> None:
    for reason in [*FORBIDDEN.values(), *LEGACY_ONLY.values()]:
        assert "(" in reason
        assert ":" in reason or "commit" in reason
    assert is_forbidden("RDMAV_HUGEPAGES_SAFE")
    assert not is_forbidden("NCCL_DEBUG")


# --- merge_env / user warnings ------------------------------------------------------------------
def test_merge_env_user_wins() -> None:
    profile = nccl_env(I("p5.48xlarge"), AUTO, "host")
    user = {"NCCL_DEBUG": "INFO", "LD_LIBRARY_PATH": "/mine", "OTHER": "1"}
    kept, user_out = merge_env(profile, user)
    assert user_out == user
    assert user_out is not user
    assert {s.name for s in kept} == {"FI_PROVIDER", "NCCL_SOCKET_IFNAME"}
    assert [s.name for s in kept] == [s.name for s in profile if s.name not in user]


def test_merge_env_empty_user() -> None:
    profile = nccl_env(I("p6-b200.48xlarge"), AUTO, "container")
    kept, user_out = merge_env(profile, {})
    assert kept == list(profile)
    assert user_out == {}


def test_user_env_warnings() -> None:
    user = {
        "NCCL_ALGO": "Tree",
        "NCCL_PROTO": "simple",
        "RDMAV_HUGEPAGES_SAFE": "1",
        "NCCL_DEBUG": "INFO",
    }
    warnings = user_env_warnings(I("p5.48xlarge"), AUTO, "host", user)
    assert len(warnings) == 3
    assert warnings[0].startswith("NCCL_ALGO: ")
    assert any(w.startswith("NCCL_PROTO: not needed") for w in warnings)
    # On a stack that needs NCCL_PROTO, the user setting it is fine.
    legacy = user_env_warnings(I("p5.48xlarge"), S(aws_ofi_nccl="1.5.0"), "host", user)
    assert not any(w.startswith("NCCL_PROTO") for w in legacy)


# --- EnvSetting / StackVersions validation ------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"value": "$(uname -m)"}, "raw_shell"),
        ({"value": "`id`"}, "raw_shell"),
        ({"value": 'a"b', "raw_shell": True}, "quote"),
        ({"value": "a\\b", "raw_shell": True}, "quote"),
        ({"reason": "two\nlines"}, "one line"),
        ({"source": ""}, "required"),
    ],
)
def test_env_setting_validation(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {"name": "X", "value": "1", "reason": "r", "source": "s"}
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        EnvSetting(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field", "expected"),
    [
        ({}, "nccl", None),
        ({"nccl": "AUTO"}, "nccl", None),
        ({"nccl": "2.27.7-1"}, "nccl", Version("2.27.7.post1")),
        ({"aws_ofi_nccl": "v1.16.3"}, "aws_ofi_nccl", Version("1.16.3")),
        ({"efa_installer": " 1.47.0 "}, "efa_installer", Version("1.47.0")),
        ({"libfabric": "1.22.0amzn4.0"}, "libfabric", Version("1.22.0")),
    ],
)
def test_stack_parse(kwargs: dict[str, str], field: str, expected: Version | None) -> None:
    assert getattr(StackVersions.parse(**kwargs), field) == expected


@pytest.mark.parametrize("field", ["efa_installer", "libfabric", "aws_ofi_nccl", "nccl"])
def test_stack_parse_invalid(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StackVersions.parse(**{field: "not-a-version"})


# --- check_minimums -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("instance", "kwargs", "warned"),
    [
        ("p5.48xlarge", {"nccl": "2.17.9"}, ["nccl"]),
        ("p5.48xlarge", {"nccl": "2.18.0"}, []),
        ("p5.48xlarge", {"nccl": "2.18.5-1"}, []),
        ("p5.48xlarge", {"aws_ofi_nccl": "1.7.1"}, ["aws_ofi_nccl"]),
        ("p5.48xlarge", {"aws_ofi_nccl": "1.7.2"}, []),
        ("p5.48xlarge", {"aws_ofi_nccl": "1.7.3"}, []),
        ("p5.48xlarge", {"efa_installer": "1.28.9"}, ["efa_installer"]),
        ("p5.48xlarge", {"efa_installer": "1.29.0"}, []),
        ("p5.48xlarge", {"efa_installer": "1.29.1"}, []),
        ("p5en.48xlarge", {"nccl": "2.17.0"}, ["nccl"]),
        ("p5e.48xlarge", {"aws_ofi_nccl": "1.6.0"}, ["aws_ofi_nccl"]),
        ("p6-b200.48xlarge", {"nccl": "2.24.3"}, ["nccl"]),
        ("p6-b200.48xlarge", {"nccl": "2.25.1"}, []),
        ("p6-b200.48xlarge", {"nccl": "2.29.3-1"}, []),
        # one Blackwell floor for every Blackwell instance (NCCL 2.25.1's release notes)
        ("p6e-gb200.36xlarge", {"nccl": "2.23.4"}, ["nccl"]),
        ("p6e-gb200.36xlarge", {"nccl": "2.27.7"}, []),
        ("p6-b300.48xlarge", {"nccl": "2.24.3-1"}, ["nccl"]),
        ("p6-b300.48xlarge", {"nccl": "2.25.1-1"}, []),
        ("p4d.24xlarge", {"nccl": "2.10.0", "aws_ofi_nccl": "1.4.0"}, []),
        ("p5.48xlarge", {}, []),  # auto: unknown versions are not warned about
        ("p6-b200.48xlarge", {}, []),
    ],
)
def test_check_minimums(instance: str, kwargs: dict[str, str], warned: list[str]) -> None:
    warnings = check_minimums(I(instance), S(**kwargs))
    assert len(warnings) == len(warned)
    for component, text in zip(warned, warnings, strict=True):
        assert f"{instance}: {component} " in text
        assert "[" in text  # cites its source


def test_the_blackwell_floor_covers_every_blackwell_instance_and_cites_nccls_notes() -> None:
    from slurmfm.catalog.nccl import BLACKWELL_FAMILIES

    blackwell = {i.family for i in INSTANCES.values() if i.gpu_model in {"B200", "B300", "GB200"}}
    assert set(BLACKWELL_FAMILIES) == blackwell
    for family in sorted(blackwell):
        inst = next(i for i in INSTANCES.values() if i.family == family)
        (warning,) = check_minimums(inst, S(nccl="2.24.3"))
        assert "below the minimum 2.25.1" in warning
        assert "github.com/NVIDIA/nccl/releases/tag/v2.25.1-1" in warning
        assert "p5 minimum" not in warning


def test_check_minimums_all_p5_components() -> None:
    warnings = check_minimums(
        I("p5en.48xlarge"), S(nccl="2.17.0", aws_ofi_nccl="1.7.0", efa_installer="1.28.0")
    )
    assert len(warnings) == 3
    assert all("floor" in w for w in warnings)


# --- property test ------------------------------------------------------------------------------
_versions = st.one_of(
    st.none(),
    st.builds(
        lambda a, b, c: Version(f"{a}.{b}.{c}"),
        st.integers(0, 3),
        st.integers(0, 40),
        st.integers(0, 12),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    efa=_versions,
    libfabric=_versions,
    ofi=_versions,
    nccl=_versions,
    runtime=st.sampled_from(RUNTIMES),
)
def test_property_profile_invariants(
    efa: Version | None,
    libfabric: Version | None,
    ofi: Version | None,
    nccl: Version | None,
    runtime: Runtime,
) -> None:
    stack = StackVersions(efa_installer=efa, libfabric=libfabric, aws_ofi_nccl=ofi, nccl=nccl)
    for instance in INSTANCES.values():
        out = nccl_env(instance, stack, runtime)
        names = [s.name for s in out]
        assert len(names) == len(set(names))
        assert all(s.source.strip() and s.reason.strip() for s in out)
        assert not any(is_forbidden(n) for n in names)
        assert all(("$" not in s.value) or s.raw_shell for s in out)
        if instance.virtual:
            assert out == ()
        else:
            legacy = efa is not None and Version(efa.base_version) < Version("1.36.0")
            assert names.count("LD_LIBRARY_PATH") == int(legacy)


def test_user_forcing_mnnvl_is_warned() -> None:
    out = user_env_warnings(I("p6e-gb200.36xlarge"), AUTO, "container", {"NCCL_MNNVL_ENABLE": "1"})
    assert len(out) == 1
    assert "single-node communicators" in out[0]
    assert not user_env_warnings(
        I("p6e-gb200.36xlarge"), AUTO, "container", {"NCCL_MNNVL_ENABLE": "0"}
    )


def test_socket_ifname_cites_jobs_that_set_this_value() -> None:
    """Issue 12 item 16: the NCCL_SOCKET_IFNAME citation named
    micro-benchmarks/nccl-tests/slurm/nccl-tests-container.sbatch, which sets no
    NCCL_SOCKET_IFNAME. The rule and the emitted line must cite the jobs that set exactly
    ``^docker,lo,veth``: the AMI nccl-tests job (``-x NCCL_SOCKET_IFNAME=^docker,lo,veth``)
    and, for the rule, the B200 V-JEPA2 job; NCCL's env docs for the ``^`` form. The value is
    the one the NCCL/EFA profile section (docs/features.md) states as the default."""
    ami = "awslabs/awsome-distributed-ai:micro-benchmarks/nccl-tests/slurm/nccl-tests-ami.sbatch"
    vjepa = (
        "awslabs/awsome-distributed-ai:"
        "3.test_cases/pytorch/vjepa2/slurm/benchmark_training_b200.sbatch"
    )
    docs = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname"
    rule = RULE_BY_ID["socket-ifname"]
    assert rule.source.split("; ") == [ami, vjepa, docs]
    (setting,) = [s for s in nccl_env(I("p5.48xlarge"), AUTO, "host") if s.name.endswith("IFNAME")]
    assert (setting.name, setting.value) == ("NCCL_SOCKET_IFNAME", "^docker,lo,veth")
    assert setting.source.split("; ") == [ami, docs]
    assert "nccl-tests-container.sbatch" not in rule.source + setting.source
    readme = (Path(__file__).resolve().parents[2] / "docs" / "features.md").read_text()
    assert "`NCCL_SOCKET_IFNAME=^docker,lo,veth`" in readme
