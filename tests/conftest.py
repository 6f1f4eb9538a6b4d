"""Fixtures shared by every test: a clean environment and the anyio backend."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No BATCHRUN_* setting leaks into a test, and state stays in its tmp_path."""
    for name in list(os.environ):
        if name.startswith("BATCHRUN_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BATCHRUN_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio unless a module asks for trio's virtual clock."""
    return "asyncio"
