"""The benchmark kit: traces (synth, stats), replay, simulate, the side-by-side bench, reports.

The top layer of agentd (docs/architecture.md): it may use ``daemon``, ``actors`` and ``sim``;
nothing imports it back.  Its commands (``agentd trace|replay|simulate|bench``) reach the CLI through
the ``agentd.commands`` entry-point group.
"""
