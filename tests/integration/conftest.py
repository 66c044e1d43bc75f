"""Fixtures for tests that drive the API in-process against the real database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from sluicegate.db import make_engine
from sluicegate.settings import Settings


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(settings.require_database_url(), pool_size=4)
    yield engine
    await engine.dispose()
