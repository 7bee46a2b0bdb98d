"""``python -m slurmfm.cli``: the same command as the ``slurmfm`` entry point."""

from slurmfm.cli import main

main()
