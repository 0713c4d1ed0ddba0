"""``fragscope mcp``: fragscope's answers for AI assistants over the Model Context Protocol (docs/mcp.md).

:mod:`.policy` (what may be read and reached) and :mod:`.tools` (the CLI's functions behind each tool) import
no SDK; :mod:`.server` needs the ``mcp`` extra (``pip install 'fragscope[mcp]'``) and is imported only by the
``fragscope mcp`` command.
"""
