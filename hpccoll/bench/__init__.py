"""The `hpccoll bench` and `hpccoll tune` commands (cli.py: arguments; sweep.py: the benchmark)."""
