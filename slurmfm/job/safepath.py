"""Python started by slurmfm never imports from the job's working directory.

Why (docs/security.md, "The working directory"): ``python -m MODULE`` puts the working
directory first on ``sys.path``, and ``python -c CODE`` puts ``''`` (the same directory)
there. A job's working directory is the submit directory, often a team's directory on the
shared file system: a ``torch/`` (or ``slurmfm/``, ``sglang/``, ``ray/``, ``nemo/``) that
another user plants there would be imported before the real package, as the job's user, in
every launch.

``-P`` / ``PYTHONSAFEPATH`` (Python 3.11+, https://docs.python.org/3/using/cmdline.html#cmdoption-P)
would do it, but the script is rendered before anyone knows the interpreter of the node or
of the container image, and ``-P`` on 3.8–3.10 is a fatal "unknown option". The
environment variable is no choice either: it is inherited by the workers torchrun starts
(``python -u train.py``) and would take the *script's* directory off their path too, where
users keep the modules their script imports. So every launch slurmfm starts runs its module
through :data:`RUN_MODULE` (``python -c RUN_MODULE MODULE ARGS...``), and every ``-c``
program slurmfm runs begins with :data:`SAFE_PATH`: the first statement drops the ``''``
entry ``-c`` put first, before anything is imported (``sys`` is built in), then ``runpy``
runs the module as ``-m`` would (``__main__``, ``sys.argv[0]`` set to the module's file).
It works from Python 3.8 on, and under ``-P`` (then there is no ``''`` to drop). Standard
library only (this module travels in the job runtime; the renderer imports it).
"""

from __future__ import annotations

# Drop the entry `-c` puts first (the working directory), before anything is imported.
SAFE_PATH = 'import sys;sys.path[:1]==[""]and sys.path.pop(0)'

# `python -c RUN_MODULE MODULE ARGS...` runs MODULE as `python -m MODULE ARGS...` would,
# with the working directory off sys.path.
RUN_MODULE = (
    SAFE_PATH + ';import runpy;runpy.run_module(sys.argv.pop(1),run_name="__main__",alter_sys=True)'
)


SHELL_VAR = "slurmfm_run_module"
"""The batch script's variable that holds :data:`RUN_MODULE`: its launch line reads
``python3 -c "$slurmfm_run_module" torch.distributed.run ...`` (slurmfm.render.script)."""


def module_words(python: str, module: str) -> list[str]:
    """The argv that runs ``module`` as ``python -m module`` would, off the working
    directory (the module's docstring)."""
    return [python, "-c", RUN_MODULE, module]


def program(code: str) -> str:
    """``code`` for ``python -c``, run with the working directory off ``sys.path``."""
    return SAFE_PATH + "\n" + code
