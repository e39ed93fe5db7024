"""Property tests with hostile input (hypothesis): parsers, webhooks, formatters, tool arguments."""
