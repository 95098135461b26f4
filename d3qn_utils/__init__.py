"""What the programs at the top of the repository need and the tutorial does not have.

`d3qn_agent.py`, `PER.py`, `rank_based.py`, `apex.py` and `blind_cliffwalk.py` import from here.
Each module's first docstring line says its role; docs/reference.md lists them.
"""
