"""The renderer's runtime store (slurmfm.render.payload.use_runtime_store): built once per
slurmfm, loaded by later processes, and keyed by everything the zip is made from."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmfm.render import payload


class Dict:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.loads = 0

    def load(self, key: str) -> bytes | None:
        self.loads += 1
        return self.data.get(key)

    def save(self, key: str, data: bytes) -> None:
        self.data[key] = data


@pytest.fixture
def store() -> Iterator[Dict]:
    s = Dict()
    payload.use_runtime_store(s)
    try:
        yield s
    finally:
        payload.use_runtime_store(None)


def test_a_stored_runtime_is_used_and_equals_a_built_one(
    store: Dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = payload.runtime_file()
    assert list(store.data.values()) == [built.data]
    assert built.data == payload._zip_bytes()
    payload.use_runtime_store(store)  # a new process: nothing in memory, the store filled

    def no_build() -> bytes:
        raise AssertionError("built again although the store had it")

    monkeypatch.setattr(payload, "_zip_bytes", no_build)
    assert payload.runtime_file() == built
    assert store.loads == 2


def test_a_damaged_stored_runtime_is_built_again_and_replaced(store: Dict) -> None:
    good = payload.runtime_file().data
    (key,) = store.data
    for bad in (
        good[:-7],
        b"PK\x05\x06" + b"\0" * 18,
        good.replace(b"slurmfm_job/node.py", b"slurmfm_job/nod3.py"),
    ):
        store.data[key] = bad
        payload.use_runtime_store(store)
        assert payload.runtime_file().data == good
        assert store.data[key] == good


def test_the_key_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any runtime module's bytes, a new module, or the Python's minor version give another
    key; the same sources give the same key."""
    job = tmp_path / "job"
    shutil.copytree(Path(payload.__file__).resolve().parent.parent / "job", job)
    monkeypatch.setattr(payload, "_job_sources", lambda: sorted(job.glob("*.py")))
    first = payload.sources_key()
    assert payload.sources_key() == first
    node = job / "node.py"
    node.write_bytes(node.read_bytes() + b"\n")
    edited = payload.sources_key()
    assert edited != first
    (job / "extra.py").write_text("X = 1\n")
    assert payload.sources_key() not in (first, edited)
    (job / "extra.py").unlink()
    assert payload.sources_key() == edited
    monkeypatch.setattr(payload.sys, "version_info", (3, 99, 0))
    assert payload.sources_key() != edited


def test_without_a_store_nothing_is_kept() -> None:
    payload.use_runtime_store(None)
    assert payload.runtime_file().data == payload._zip_bytes()
