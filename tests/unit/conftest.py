"""Fixtures of the model tests: a quick-retrying client for the fake OpenAI server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent.llm import LLMClient
from tests.fakes.openai_server import FakeOpenAI


@pytest.fixture
async def model(fake: FakeOpenAI) -> AsyncIterator[LLMClient]:
    """One retry, a few milliseconds apart."""
    client = LLMClient(
        model="gpt-test", base_url=fake.base_url, api_key="sk-test-key-000000", request_timeout_s=10,
        max_retries=1, retry_base_s=0.01, retry_cap_s=0.02,
    )
    yield client
    await client.aclose()
