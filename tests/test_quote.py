"""The one quoting function: every string either round-trips through bash exactly or is refused."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmfm.errors import UnsafeValueError
from slurmfm.quote import env_name, sbatch_value, sh_join, sh_quote

# Text without NUL (bash words cannot hold NUL), biased toward shell metacharacters.
META = st.sampled_from(list("$`\\\"' \t\n;&|<>(){}[]*?~!#=%^,:@+-") + ["$(id)", "`id`", "${X}"])
# (nor a carriage return: sbatch refuses a script with one, so sh_quote refuses it too)
TEXT = st.lists(st.one_of(st.characters(exclude_characters="\x00\r"), META), max_size=40).map(
    "".join
)


def bash_echo(words: str) -> list[str]:
    """Run ``printf '%s\\0' WORDS`` in bash and return the words bash saw."""
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {words}"], capture_output=True, check=True
    ).stdout
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(TEXT)
def test_sh_quote_round_trips_through_bash(value: str) -> None:
    encoded = value.encode("utf-8", "surrogatepass")
    try:
        encoded.decode("utf-8")
    except UnicodeDecodeError:
        return  # lone surrogates cannot be written to a script file at all
    assert bash_echo(sh_quote(value)) == [value]


@settings(max_examples=100, deadline=None)
@given(st.lists(TEXT.filter(lambda s: s.isprintable() or s == ""), max_size=5))
def test_sh_join_keeps_word_boundaries(words: list[str]) -> None:
    got = bash_echo(sh_join(words)) if words else []
    assert got == words


def test_nul_is_refused() -> None:
    with pytest.raises(UnsafeValueError, match="NUL"):
        sh_quote("a\x00b", what="env X")
    with pytest.raises(UnsafeValueError, match="carriage return"):
        sh_quote("a\rb", what="env X")


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain", "plain"),
        ("a b", "'a b'"),
        ("", "''"),
        ("it's", "'it'\\''s'"),
        ("x=1", "'x=1'"),
        ("~root", "'~root'"),
        ("/fsx/a-b_c.d:1,2", "/fsx/a-b_c.d:1,2"),
    ],
)
def test_sh_quote_examples(value: str, quoted: str) -> None:
    assert sh_quote(value) == quoted


@pytest.mark.parametrize("value", ["a b", "a'b", 'a"b', "a\nb", "a#b", "a;b", "a$b", "a\\b"])
def test_sbatch_value_refuses_what_sbatch_would_split(value: str) -> None:
    with pytest.raises(UnsafeValueError, match="cannot carry safely"):
        sbatch_value(value, what="cluster.partition")


def test_sbatch_value_accepts_slurm_syntax() -> None:
    for v in ["gpu", "p5&efa", "[a|b]*2", "runs/logs/%x_%j.out", "node[001-004]"]:
        assert sbatch_value(v, what="x") == v
    with pytest.raises(UnsafeValueError, match="must not be empty"):
        sbatch_value("", what="x")


def test_env_name() -> None:
    assert env_name("NCCL_DEBUG") == "NCCL_DEBUG"
    for bad in ["1X", "A-B", "A B", "", "$X"]:
        with pytest.raises(UnsafeValueError):
            env_name(bad)
