"""apex.py's parts, one module a job: the actors (`actor`), the replay (`replay`), the learner
(`learner`), the Ray connection (`connection`) and the progress lines, TensorBoard and plot
(`report`). A package of their own beside d3qn_utils/: they build on d3qn_agent.py's network and
PER.py's memories, which build on d3qn_utils/."""
