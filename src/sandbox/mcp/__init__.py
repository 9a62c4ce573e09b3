"""`sandbox mcp`: the sandbox served as Model Context Protocol tools.

`server` holds the tools and the entry point (`server.main`), `transports` the stdio and
streamable HTTP transports. Nothing is imported here, so importing `sandbox.mcp` needs
no MCP SDK; `sandbox.mcp.server` does (extra `mcp`). The modules import the SDK as
`mcp` with absolute imports, which name the top-level SDK, never this package.
"""
