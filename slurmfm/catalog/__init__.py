"""Static knowledge about AWS GPU instances, the NCCL/EFA stack and Slurm versions.

Why a separate package: these are facts with primary sources (repository files, release
notes, documentation URLs), not logic. Keeping them as frozen data plus pure functions lets the
planner, renderer and validator share one cited answer to "what does this hardware/stack/Slurm
support", and lets tests check every fact and rule on its own.
"""
