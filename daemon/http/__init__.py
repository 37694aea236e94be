"""agentd's HTTP layer: the Quart-Trio app, the proxy routes and the operational endpoints."""
