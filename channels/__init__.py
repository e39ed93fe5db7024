"""Chat adapters: each normalizes platform updates into ``RunRequest``s and delivers replies.

- ``base.py``            the contract with the daemon (``ChannelAdapter``, ``ReplyStream``,
                         ``ChannelContext``, ``Target``, ``ChannelStartError``).
- ``telegram/``, ``slack/``  the platforms (each has a README with its module map).
- ``console.py``         ``botd chat`` on a terminal; ``console_input.py``: how what is
                         typed or pasted becomes messages.
- ``chunking.py``        boundary-aware splitting of long text into platform-sized parts.
- ``preview_memory.py``  a run's live preview id, kept so a retried run can adopt it.
"""
