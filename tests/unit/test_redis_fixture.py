from __future__ import annotations

import redis.asyncio as aioredis


async def test_real_redis_answers(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    key = f"{redis_prefix}:ping"
    assert await redis_client.set(key, "1", nx=True, ex=5)
    assert not await redis_client.set(key, "2", nx=True, ex=5)
    assert await redis_client.get(key) == "1"
