"""Benchmark tools that judge slurmfm from outside, kept out of the installed package.

Why apart: the placement referee (:mod:`bench.referee`) and the exact optimum
(:mod:`bench.optimum`, a MILP on HiGHS) exist to score the planner, not to run jobs; a user's
``pip install slurmfm`` has no use for them, and a benchmark the package could import is one
the planner could be tuned against. ``scripts/bench_referee.py``, ``scripts/bench_placement.py``
and the tests under ``tests/plan/`` import them from the checkout (the repository root is on
their ``sys.path``).
"""
