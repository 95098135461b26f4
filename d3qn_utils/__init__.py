"""What the programs at the top of the repository need and the tutorial does not have.

`d3qn_agent.py`, `PER.py`, `rank_based.py`, `apex.py` and `blind_cliffwalk.py` import from here:
the command line and presets, the games' environments and replay storage, the compiled calls of
each Keras backend, reporting, checkpoints and recordings. Each module's first docstring line
says its role; docs/reference.md lists them.
"""
