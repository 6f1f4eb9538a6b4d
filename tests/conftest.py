"""Fixtures shared by every test: a clean environment and the anyio backend."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No BATCHRUN_* setting of the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("BATCHRUN_"):
            monkeypatch.delenv(name)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio unless a module asks for trio's virtual clock."""
    return "asyncio"
