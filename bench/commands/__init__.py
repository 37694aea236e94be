"""The benchmark kit's sub-commands, registered under the ``agentd.commands`` entry-point group."""
