"""Shared fixtures for the agentd test suite."""
