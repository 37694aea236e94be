"""The pure, sans-IO scheduling core: no trio, httpx, quart, prometheus, clock, logging or randomness."""
