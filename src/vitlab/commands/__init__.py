"""Sub-commands of the ``vitlab`` CLI, one module each (see :mod:`vitlab.cli`)."""
