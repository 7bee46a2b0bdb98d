"""Recipe schema and loading: ``recipe.yaml`` -> validated :class:`Recipe`."""

from slurmfm.recipe.loader import load_recipe, parse_override, validate
from slurmfm.recipe.schema import Recipe

__all__ = ["Recipe", "load_recipe", "parse_override", "validate"]
