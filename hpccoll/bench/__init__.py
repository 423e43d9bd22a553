"""The `hpccoll bench` and `hpccoll tune` commands.

cli.py (arguments, checked before anything runs) -> sweep.py (the sweep) -> rows.py (one row of
hpccoll's calls in every mode) and baselines.py (NCCL, torch symmetric memory), on timing.py
(how a latency is taken), cases.py (buffers and checks), sol.py (the speed-of-light model),
ranks.py (what the ranks agree on); report.py (table, JSON, plot, provenance); tune.py (the
tuning table); collectives.py and sizes.py (names and sizes of the command line)."""
