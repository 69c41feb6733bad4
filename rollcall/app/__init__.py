"""The application above the core, the scenario layer and the drivers.

The command line (``cli``, ``cli_hosts``), the Python API (``api``), the
experiments (``sweeps``, ``suite``, ``calibrate``, ``plan``), where runs
execute (``engines``), the reading of results (``analysis``, ``stats``,
``interval``, ``verdict``, ``decisions``, ``report``) and the one registry
that finds a driver (``targets``). Nothing under ``sim/``, ``real/``,
``rollcall/core/`` or ``rollcall/scenario/`` imports this package.
"""
