"""Trio actors of agentd; the pure scheduling core lives in ``actors.core``."""
