"""Benchmark kit: replay reports, the side-by-side bench driver, report.md and plots."""
