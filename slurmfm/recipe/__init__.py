"""Recipe schema and loading: ``recipe.yaml`` -> validated :class:`Recipe`.

The names below are loaded on first use (PEP 562), so that importing a submodule does not
import the whole schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmfm.recipe.loader import load_recipe, parse_override, validate
    from slurmfm.recipe.schema import Recipe

__all__ = ["Recipe", "load_recipe", "parse_override", "validate"]


def __getattr__(name: str) -> Any:
    if name == "Recipe":
        from slurmfm.recipe.schema import Recipe

        return Recipe
    if name in ("load_recipe", "parse_override", "validate"):
        from slurmfm.recipe import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
