"""The agent runtime: the loop, the model client, context handling and tools. Knows
nothing of chats or Redis; the daemon passes everything in.

- ``types.py``        the value types every package shares (``RunRequest``, ``Message``,
                      the ``AgentEvent`` union, ``RunResult``).
- ``loop.py``         ask the model, run the tools it calls, repeat; every exit leaves a
                      valid history. ``budget.py``: will the next request fit the window.
- ``llm.py``          the OpenAI-compatible client (``llm_wire.py`` sends the request as
                      the SDK would, ``llm_errors.py`` says what a failure was,
                      ``llm_stream.py`` assembles a stream, ``llm_types.py`` is the model
                      contract, ``openai_sdk.py`` loads the SDK without its type modules);
                      ``notices.py`` what a chat user is told when an answer fails or is cut.
- ``http/``           the keep-alive HTTP/1.1 client under the model's requests and the
                      Bot API's calls (an httpx2 transport for the SDK).
- ``history.py``      the pipeline before each call (``pruning.py``, ``history_repair.py``);
                      ``tokens.py`` the one token estimate; ``images.py`` vision copies.
- ``compaction.py``   memory flush and summary (``compaction_memory.py``,
                      ``compaction_summary.py``).
- ``prompt.py``       the system prompt (``prompt_files.py`` reads the workspace files).
- ``guard.py``, ``sanitize.py``  inbound injection scan; outbound cleaning and silent replies.
- ``tasks.py``        the one home of the cancellation workarounds; ``Slots``, a
                      semaphore whose free slot is taken without awaiting.
- ``tools/``          the tools and the sandbox they run in.
"""
