"""Fairness checking: adversarial multi-tenant traces, their properties and ``agentd check-fairness``.

``scenarios`` builds the adversarial traces (one tenant flooding, long-context hogs, priority
floods, interactive under batch) sized to a simulated cluster; ``properties`` measures a
simulation report against a bound; ``shrink`` reduces a violating trace; ``check`` runs it all
(docs/priority.md §6).
"""
