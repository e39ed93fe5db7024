"""SlackApi against the fake Slack: rate limits honoured, transient errors retried, others raised,
over botd's Web API client (``WebClient``) and over slack_sdk's own aiohttp one."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient

from agent.http import HTTPClient
from channels.base import DeliveryUnknown
from channels.slack.api import SlackApi, SlackCallError, WebClient
from tests.fakes.slack_server import FakeSlack


class SleepRecorder:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


Client = Callable[[str, str], AsyncWebClient]  # (token, base URL) -> a Web API client


@pytest.fixture(params=["botd", "slack_sdk"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """botd's ``WebClient`` (the calls over ``agent.http``), or slack_sdk's over aiohttp."""
    async with aiohttp.ClientSession() as session:
        http = HTTPClient()
        try:
            if request.param == "botd":
                yield lambda token, url: WebClient(token=token, base_url=url, session=session, retry_handlers=[],
                                                   http=http)
            else:
                yield lambda token, url: AsyncWebClient(token=token, base_url=url, session=session, retry_handlers=[])
        finally:
            await http.aclose()


def make_api(fake: FakeSlack, client: Client, sleep: SleepRecorder, token: str | None = None) -> SlackApi:
    return SlackApi(client(token or fake.bot_token, fake.api_url), max_retries=3, sleep=sleep)


async def test_call_returns_slack_answer(fake: FakeSlack, client: Client) -> None:
    api = make_api(fake, client, SleepRecorder())
    data = await api.call("chat.postMessage", channel="C1", text="hi", thread_ts="1.1")
    assert data["ok"] is True and data["channel"] == "C1"
    [call] = fake.calls_to("chat.postMessage")
    assert call.token == fake.bot_token
    assert call.args["thread_ts"] == "1.1"


async def test_ratelimited_waits_retry_after_then_succeeds(
    fake: FakeSlack, client: Client
) -> None:
    sleep = SleepRecorder()
    api = make_api(fake, client, sleep)
    fake.rate_limit("chat.update", times=2, retry_after=7)
    posted = await api.call("chat.postMessage", channel="C1", text="a")
    await api.call("chat.update", channel="C1", ts=posted["ts"], text="b", run_id="run-1")
    assert sleep.delays == [7.0, 7.0]
    assert len(fake.calls_to("chat.update")) == 3
    assert fake.messages[("C1", posted["ts"])]["text"] == "b"


async def test_real_sleep_honours_retry_after(fake: FakeSlack, client: Client) -> None:
    api = SlackApi(client(fake.bot_token, fake.api_url))
    fake.rate_limit("auth.test", times=1, retry_after=1)
    await api.call("auth.test")
    first, second = fake.calls_to("auth.test")
    assert second.at - first.at >= 0.9


async def test_rate_limit_waits_are_bounded(fake: FakeSlack, client: Client) -> None:
    api = make_api(fake, client, SleepRecorder())
    fake.rate_limit("auth.test", times=50, retry_after=1)
    with pytest.raises(SlackCallError, match="ratelimited"):
        await api.call("auth.test")
    assert len(fake.calls_to("auth.test")) == 6  # first try + 5 waits


async def test_transient_errors_are_retried_three_times(
    fake: FakeSlack, client: Client
) -> None:
    sleep = SleepRecorder()
    api = make_api(fake, client, sleep)
    fake.fail("chat.postMessage", "internal_error", times=2)
    data = await api.call("chat.postMessage", channel="C1", text="x")
    assert data["ok"]
    assert len(fake.calls_to("chat.postMessage")) == 3
    assert sleep.delays == [0.5, 1.0]

    fake.fail("chat.postMessage", "service_unavailable", times=10, status=503)
    with pytest.raises(SlackCallError) as info:
        await api.call("chat.postMessage", channel="C1", text="x")
    assert info.value.error == "service_unavailable" and info.value.status == 503
    assert len(fake.calls_to("chat.postMessage")) == 3 + 4


async def test_permanent_error_fails_at_once(fake: FakeSlack, client: Client) -> None:
    api = make_api(fake, client, SleepRecorder())
    fake.fail("chat.postMessage", "channel_not_found")
    with pytest.raises(SlackCallError) as info:
        await api.call("chat.postMessage", channel="CNOPE", text="x")
    assert info.value.error == "channel_not_found"
    assert info.value.method == "chat.postMessage"
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_bad_token_is_invalid_auth_and_never_in_the_message(
    fake: FakeSlack, client: Client
) -> None:
    api = make_api(fake, client, SleepRecorder(), token="xoxb-wrong-secret")
    with pytest.raises(SlackCallError) as info:
        await api.call("auth.test")
    assert info.value.error == "invalid_auth"
    assert "xoxb-wrong-secret" not in str(info.value)


async def test_connection_errors_are_retried_then_raised(client: Client) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleep = SleepRecorder()
    api = SlackApi(client("xoxb-x", f"http://127.0.0.1:{port}/api/"), max_retries=2, sleep=sleep)
    with pytest.raises(SlackCallError) as info:
        await api.call("auth.test")
    assert "Connect" in info.value.error or "OSError" in info.value.error
    assert len(sleep.delays) == 2


async def test_unknown_method_is_a_clear_error(fake: FakeSlack, client: Client) -> None:
    api = make_api(fake, client, SleepRecorder())
    with pytest.raises(ValueError, match="unknown Slack method"):
        await api.call("no.suchMethod")


async def test_a_calls_query_arrives_and_its_url_is_split_once(fake: FakeSlack, client: Client) -> None:
    """reactions.add goes with its arguments in the query: each reaches Slack, and the
    method's URL is parsed once however many messages are reacted to."""
    from agent.http import split_url

    api = make_api(fake, client, SleepRecorder())
    posted = await api.call("chat.postMessage", channel="C1", text="hi")
    await api.call("reactions.add", channel="C1", timestamp=posted["ts"], name="eyes")
    cached = split_url.cache_info().currsize
    for n in range(5):
        await api.call("reactions.remove", channel="C1", timestamp=posted["ts"], name=f"eyes{n - 1}" if n else "eyes")
        await api.call("reactions.add", channel="C1", timestamp=posted["ts"], name=f"eyes{n}")
    [first, *_] = fake.calls_to("reactions.add")
    assert (first.args["channel"], first.args["timestamp"], first.args["name"]) == ("C1", posted["ts"], "eyes")
    assert [c.args["name"] for c in fake.calls_to("reactions.add")][1:] == [f"eyes{n}" for n in range(5)]
    assert split_url.cache_info().currsize <= cached + 1  # reactions.remove's URL, once


async def test_a_post_whose_answer_was_lost_is_not_posted_twice(fake: FakeSlack, client: Client) -> None:
    # Slack made the message and the connection closed before its answer: posting it
    # again would show it twice. A call that changes nothing new (a reaction) is retried.
    sleep = SleepRecorder()
    api = make_api(fake, client, sleep)
    fake.drop("chat.postMessage", after_effect=True)
    with pytest.raises(DeliveryUnknown):
        await api.call("chat.postMessage", channel="C1", text="shown once")
    assert len(fake.calls_to("chat.postMessage")) == 1 and sleep.delays == []
    fake.drop("reactions.add", after_effect=True)
    with pytest.raises(SlackCallError, match="already_reacted"):  # which the stream counts as done
        await api.call("reactions.add", channel="C1", timestamp="1.1", name="eyes")
    assert len(fake.calls_to("reactions.add")) == 2


async def test_a_post_that_timed_out_is_not_posted_twice(fake: FakeSlack) -> None:
    http = HTTPClient()
    try:
        client = WebClient(token=fake.bot_token, base_url=fake.api_url, retry_handlers=[], http=http, timeout=0.3)
        api = SlackApi(client, sleep=SleepRecorder())
        fake.hang("chat.postMessage", 1.0)
        with pytest.raises(DeliveryUnknown):
            await api.call("chat.postMessage", channel="C1", text="late")
        assert len(fake.calls_to("chat.postMessage")) == 1
    finally:
        await http.aclose()
