"""Turn a validated recipe (and optional placement plan) into an sbatch script, purely."""
