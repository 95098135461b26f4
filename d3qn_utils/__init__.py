"""What the programs at the top of the repository need and the tutorial does not have.

`d3qn_agent.py`, `PER.py`, `rank_based.py`, `apex.py` and `blind_cliffwalk.py` import from here.
Each module's first docstring line says its role; docs/reference.md lists them.
"""

import os

# numpy's OpenBLAS threads, once woken by a batch (the numpy forward pass that acts for N_ENVS
# environments, greedy_policy.py), keep spinning beside TensorFlow's gradient steps on a few
# cores and slow them (docs/benchmarks.md, "Many environments, one memory"). Set before numpy is
# first imported (the scripts import this package first); an OPENBLAS_NUM_THREADS set by the
# user wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
