"""The gateway: turns RunRequests into runs and replies, exactly once, one run per session.

Modules, in the order a message meets them (DESIGN.md §2):

- ``gateway.py``   ``Gateway.submit()``: intake, dedupe, control commands, enqueue (for an
                   idle session, its lock, its batch and the run's first read taken in the
                   same round trip).
- ``control.py``   control commands (/stop, /new, /status, /compact, /model, /usage, …):
                   parsed and answered at once (/compact in the background).
- ``inbox.py``     the per-session inboxes in Redis (waiting → running → finished) and
                   the inbound dedupe of everything never queued (``Deduper``).
- ``worker.py``    serving a session: lock and first batch, drain, run, sweep; the run
                   slots (one taken with an intake's claim); stops that come before a run
                   is registered.
- ``session_run.py`` ``SessionRun``: one run's cancellation (/stop, timeout, lost lock,
                   shutdown, fold) and the steering asked for before every LLM call.
- ``run.py``       one batch as one run: resume a saved result, prepare, run the agent,
                   finish (store and record, deliver).
- ``run_control.py`` what a run and its owner agree on: ``RunControl``, ``RunOutcome``,
                   the reasons after which a batch runs again.
- ``prompt.py``    the run's system prompt, from the config, the tools and the session.
- ``observer.py``  ``RunObserver``: the agent's events as previews, tool spans, metrics.
- ``attachments.py`` files a message brought, fetched into the session's ``inbox/`` before
                   the run asks the model; ``send_file``'s uploads, once per run.
- ``context.py``   the session's context: its fill, the compaction hook a run's
                   pre-flight budget check calls (``agent.budget``), the warning notice.
- ``reply.py``     live previews and exactly-once delivery (``DeliveryLedger``).
- ``redelivery.py`` parts whose send failed, retried with backoff by any replica for a
                   bounded time, then given up and the chat told once.
- ``signals.py``   the process's one pub/sub listener (``Broadcast``), cross-replica
                   stops and the outcomes of scheduled runs.
- ``approvals.py`` approval requests for admin tools.
"""
