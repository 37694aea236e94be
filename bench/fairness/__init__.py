"""Fairness checking: adversarial multi-tenant traces, their properties and ``agentd check-fairness``.

``scenarios`` builds the adversarial traces (one tenant flooding, long-context hogs, priority
floods, interactive under batch) sized to a simulated cluster; ``properties`` measures a
simulation report against a bound; ``machines`` runs the core's state machines
(``core_machines``); ``check`` runs it all and shrinks a violating trace (docs/priority.md §6).
"""
