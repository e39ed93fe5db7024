"""The gateway: turns RunRequests into runs and replies, exactly once, one run per session."""
