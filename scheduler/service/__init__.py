"""The agents' service: leases and queue, store, auth, processes, REST + MCP + client."""
