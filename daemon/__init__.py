"""agentd: a scheduling daemon in front of vLLM-compatible workers."""

__version__ = "0.1.0"
