"""Tools the model can call, and the boundaries they run inside.

- ``registry.py``     tool definitions, argument validation, ``ToolSettings`` (paths,
                      sandbox) and ``ToolContext``; ``policy.py`` which categories may run.
- ``sandbox.py``      bubblewrap and per-call limits for every tool subprocess;
                      ``process.py`` runs one (process group, timeout, output cap);
                      ``environment.py`` the environment it gets.
- ``bash.py``         the ``bash`` tool; its blocklist: ``command_guard.py`` over
                      ``shell_syntax.py`` / ``shell_commands.py``, rules in ``command_rules.py``.
- ``files.py``        ``read_file``, ``write_file``, ``list_directory``; ``paths.py`` what
                      they may touch, ``safe_open.py`` opening exactly the checked path.
- ``send_file.py``    ``send_file``: a file from the allowed paths to the run's chat.
- ``cli_tools.py``    tools declared in YAML (``cli_tool.py`` is one of them).
- ``mcp.py``          MCP servers as tool sources (``mcp_connection.py`` one server,
                      ``mcp_stdio.py`` its process, ``mcp_spec.py`` its spec and status,
                      ``mcp_tool.py`` its tools); ``builtin.py`` the tools every agent gets.
"""
