"""Shared pytest fixtures. Add new fixtures below the object-storage section."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from batchscale import localstore
from batchscale.storage import ObjectStore

# --- object storage: a real SeaweedFS (`weed mini`) on loopback, one per test session ---------


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[localstore.StoreInfo]:
    """A running local store on free loopback ports, stopped at the end of the session."""
    workdir = tmp_path_factory.mktemp("seaweed")
    info = localstore.up(workdir)
    yield info
    localstore.down(workdir)


@pytest.fixture
def object_store(seaweed: localstore.StoreInfo) -> ObjectStore:
    """An ObjectStore on the session's SeaweedFS, under a prefix no other test uses."""
    return ObjectStore(seaweed.settings(prefix=f"test-{uuid.uuid4().hex[:12]}"), max_attempts=2)
