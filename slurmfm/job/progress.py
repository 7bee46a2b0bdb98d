"""A launch's training progress: one definition for the failure judgement (:mod:`.classify`,
"after progress") and the hang watch (:mod:`.hang`).

Progress is any of, since the launch started:

* a new report in ``$SLURMFM_PROGRESS_FILE`` (:func:`slurmfm.checkpoint.report_progress`);
* a new complete checkpoint, or a moved Megatron tracker (:func:`.evidence.progress_mark`);
* a new step line of an unmodified framework in the job log (:data:`LINES`): Megatron-LM's
  ``iteration N/ M |`` (NVIDIA/Megatron-LM megatron/training/training.py ``training_log``,
  printed by the last rank every ``--log-interval`` iterations), NeMo 2's ``Training epoch E,
  iteration N/M`` (NVIDIA/NeMo nemo/lightning/pytorch/callbacks/progress_printer.py),
  Lightning's progress bar ``Epoch E:  P%|...| N/M`` (Lightning-AI/pytorch-lightning
  src/lightning/pytorch/callbacks/progress/tqdm_progress.py; tqdm ends each refresh with a
  carriage return, which splits it into a line of its own here) and the Hugging Face
  Trainer's log dictionaries ``{'loss': ..., 'epoch': E}`` (huggingface/transformers
  src/transformers/trainer_callback.py, ``ProgressCallback.on_log``). A line counts when it
  differs from the last one of its framework: a progress bar redrawn at the same step is not
  progress.

Before, a failure in a container launch (no node entry to report, no checkpoint for hours at a
``save-interval`` of 500) was judged "progress: unknown" and failed the job; now the lines
the training prints anyway say it got on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from .evidence import progress_since

# (framework, pattern): the groups a step line is told apart by; NeMo's before Megatron's,
# whose pattern its line also matches
LINES = (
    ("NeMo iteration", re.compile(r"\bTraining epoch (\d+), iteration (\d+)/(\d+)")),
    ("Megatron-LM iteration", re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")),
    ("Lightning step", re.compile(r"\bEpoch (\d+):\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+|\?)")),
    ("Trainer log", re.compile(r"(\{'loss': [^{}\r\n]*'epoch': [0-9.e+-]+\})")),
)
CHECK_S = 5.0  # how often the watch reads the log and the marks while the launch runs


def step_line(line: str) -> tuple[str, tuple[str, ...]] | None:
    """(framework, what tells its steps apart) of a framework's step line, else None."""
    for name, pattern in LINES:
        m = pattern.search(line)
        if m is not None:
            return name, m.groups()
    return None


def read_new(path: str, offset: int, cap: int = 1 << 20) -> tuple[list[str], int]:
    """Lines appended to ``path`` since ``offset`` (at most the last ``cap`` bytes) and the
    new offset."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return [], offset
    with os.fdopen(fd, "rb") as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            if size <= offset:
                return [], size
            fh.seek(max(offset, size - cap))
            data = fh.read(cap)
        except OSError:
            return [], offset
    return data.decode("utf-8", "replace").splitlines(), size


def span(seconds: float) -> str:
    """``3600`` as ``1h``, ``1800`` as ``30m``, ``45`` as ``45s``: a timeout as recipes write it."""
    s = int(seconds)
    if s and s % 3600 == 0:
        return "%dh" % (s // 3600)
    if s and s % 60 == 0:
        return "%dm" % (s // 60)
    return "%ds" % s


class Progress:
    """One launch's progress (see the module docstring): polled while it runs, asked when it
    ended. ``mark`` reads the checkpoint and progress file; ``log`` is where the job log
    stood when the launch started."""

    def __init__(
        self,
        mark: Callable[[], dict[str, str]],
        log: tuple[str, int] | None,
        clock: Callable[[], float],
    ) -> None:
        self.mark_fn = mark
        self.clock = clock
        self.first_mark = self.mark = mark()
        self.log_path, self.offset = log if log is not None else ("", 0)
        self.started = self.last = clock()
        self.first_s: float | None = None  # seconds from the start to the first progress
        self.what = "none since the step started"
        self.first_what = ""  # what the first progress was (the earliest line of that read)
        self.keys: dict[str, tuple[str, ...]] = {}
        self.line = ""  # the last step line seen ("" none)
        self.next_check = self.started

    def poll(self, force: bool = False) -> bool:
        """Read what is new (at most every :data:`CHECK_S` unless ``force``); True when it
        shows progress."""
        now = self.clock()
        if not force and now < self.next_check:
            return False
        self.next_check = now + CHECK_S
        seen = earliest = ""
        mark = self.mark_fn()
        if mark != self.mark:
            self.mark = mark
            seen = earliest = "progress report or checkpoint"
        if self.log_path:
            lines, self.offset = read_new(self.log_path, self.offset)
            for text in lines:
                got = step_line(text)
                if got is not None and self.keys.get(got[0]) != got[1]:
                    self.keys[got[0]] = got[1]
                    self.line = "%s %s" % (got[0], "/".join(got[1][-2:]))
                    seen = self.line
                    earliest = earliest or seen
        if not seen:
            return False
        self.last, self.what = now, seen
        if self.first_s is None:
            # several lines in one read: the first progress is the earliest of them (a slow
            # start's "iteration 10/20", not the "20/20" printed after it)
            self.first_s, self.first_what = now - self.started, earliest
        return True

    def since_start(self) -> tuple[bool | None, str]:
        """(progress?, what) over the whole launch, as :func:`.evidence.progress_since` says
        it, with the step lines counted too (None: nothing could tell)."""
        self.poll(force=True)
        got, note = progress_since(self.first_mark, self.mark)
        if self.line:
            return True, ", ".join(x for x in (note, "last " + self.line) if x)
        return got, note
