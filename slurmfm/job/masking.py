"""Secret values never printed: the one rule for which names are secret and how a launch
line is shown.

Why: the job log is read by the team (a 2775 log directory) and kept. A token reaches a
launch line when the recipe passes ``$HF_TOKEN`` in ``launcher.args``, whether it came
through ``secrets:`` (the batch step knows those names) or, against the advice ``validate``
gives, through ``env:``. So every launch line the runtime prints replaces the values of the
listed secrets and of every variable whose name looks secret (:data:`SECRET_NAME`, the same
pattern ``slurmfm validate`` warns about in ``env:``). Standard library only, Python 3.8.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

# Names that look like they hold a secret (case-insensitive): HF_TOKEN, WANDB_API_KEY, ...
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY", re.IGNORECASE)
# Shorter values are not masked: "1" or "off" inside every word would make a line unreadable.
MIN_LEN = 4
SHOWN = "<secret>"


def looks_secret(name: str) -> bool:
    """Whether a variable's name says it holds a secret."""
    return bool(SECRET_NAME.search(name))


def secret_values(env: Mapping[str, str], names: Iterable[str] = ()) -> list[str]:
    """The values to mask: of ``names`` and of every variable that looks secret, longest
    first (a token that contains another is replaced whole)."""
    wanted = set(names)
    values = {
        v for k, v in env.items() if (k in wanted or looks_secret(k)) and len(v or "") >= MIN_LEN
    }
    return sorted(values, key=len, reverse=True)


def mask(words: Sequence[str], env: Mapping[str, str], names: Iterable[str] = ()) -> list[str]:
    """``words`` with every secret value replaced by ``<secret>``."""
    values = secret_values(env, names)
    out = []
    for word in words:
        shown = word
        for v in values:
            shown = shown.replace(v, SHOWN)
        out.append(shown)
    return out


def line(
    words: Sequence[str],
    env: Mapping[str, str],
    names: Iterable[str] = (),
    named: Mapping[str, str] | None = None,
) -> str:
    """The masked words as one shell line; a word in ``named`` is shown as the script names
    it (the runtime's check program as ``$slurmfm_checked``, the working-directory guard as
    ``"$slurmfm_run_module"``), not as the program text the shell expanded it to."""
    named = named or {}
    shown = mask(words, env, names)  # one word each, in order (Python 3.8: no zip(strict=))
    return " ".join(named.get(w) or shlex.quote(shown[i]) for i, w in enumerate(words))


def env_warnings(env: Mapping[str, str]) -> list[str]:
    """One warning per ``env:`` entry whose name looks secret: ``env:`` values are written
    into the job script, which Slurm keeps and the render cache holds; ``secrets:`` names are
    exported from the submitting shell instead and never written."""
    return [
        f"env.{name}: looks like a secret; env: values are written into the job script "
        "(Slurm keeps a copy): list the name under secrets: and export it where you submit"
        for name in sorted(env)
        if looks_secret(name) and env[name]
    ]
