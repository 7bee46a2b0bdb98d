"""The runtime's options: one typed value per subcommand, the renderer's and the runtime's alike.

Why here: the batch script passes these options from the renderer (slurmfm/render/script.py)
to the runtime (:mod:`.cli`). Declared on both sides, their defaults drifted (the recipe's
``drain_unhealthy`` defaults to true, the runtime's ``--drain`` was 0). Now each subcommand's
options are one frozen dataclass: the renderer builds the value and writes
:meth:`Options.to_argv`, the runtime parses it back with :meth:`Options.from_argv` (the same
argparse options, built from the fields), and the recipe schema takes its defaults from these
fields. ``from_argv(x.to_argv()) == x`` for every value (tests/job/test_options.py).

The words: ``--flag VALUE`` for each field (``--name-with-dashes`` from ``name_with_dashes``),
``--flag=VALUE`` when the value starts with ``-`` (argparse would take it for an option), a
switch as ``1``/``0``, a float without a trailing ``.0``, a tuple field as one ``--flag VALUE``
per item. Where :attr:`Opt.bare` is set the switch is a bare ``--flag`` (``health --imex``).

Standard library only, Python 3.8: this module travels in the job runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

if TYPE_CHECKING:
    import argparse  # imported where a parser is built: see Options.from_words

__all__ = [
    "BatchOptions",
    "ContainerRemoveOptions",
    "ForwardOptions",
    "HealthOptions",
    "NodeOptions",
    "Options",
    "PrepareOptions",
    "TaskOptions",
    "flag",
    "word",
]

_T = TypeVar("_T", bound="Options")
SIGNALS = ("TERM", "USR2", "INT")
# $0 of a container launch's first program (``srun ... sh -c PROGRAM slurmfm-node ENTRY``),
# which error messages of ``sh`` name.
CONTAINER_ENTRY = "slurmfm-node"


def word(value: object) -> str:
    """One option value as the runtime reads it back: a switch as 1/0, 600.0 as 600."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _switch(text: str) -> bool:
    """``--drain 1``: any integer, non-zero is on (what the int options accepted before)."""
    return int(text) != 0


def _dashes(value: Any) -> Any:
    """An option's text that is exactly ``--``: argparse (Python 3.11, checked) takes
    ``--name=--`` and hands back ``[]`` instead, as it drops every ``--`` from an option's
    arguments; :meth:`Options.words` writes such a value that way and
    :meth:`Options.from_words` reads it, so the two readers agree."""
    return "--" if isinstance(value, list) and not value else value


def flag(name: str) -> str:
    """The option of field ``name``: ``max_restarts`` -> ``--max-restarts``."""
    return "--" + name.replace("_", "-")


class Options:
    """What every subcommand's options do. Each subclass also derives from a ``NamedTuple`` of
    its fields (typed, immutable, compared by value).

    Why ``NamedTuple`` and not a dataclass: ``dataclasses`` imports ``inspect``, tens of
    milliseconds at every start of the runtime on every node; ``typing`` is loaded anyway.
    """

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    BARE: ClassVar[frozenset[str]] = frozenset()  # switches written as a bare ``--flag``
    REQUIRED: ClassVar[frozenset[str]] = frozenset()  # always written, refused when missing

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each field's default, in declaration order."""
        # the NamedTuple's (this mixin itself has none)
        d: dict[str, Any] = getattr(cls, "_field_defaults")  # noqa: B009
        return {name: d[name] for name in getattr(cls, "_fields")}  # noqa: B009

    @classmethod
    def add_to(cls, p: argparse.ArgumentParser) -> None:
        """Declare the fields as ``p``'s options (the runtime's parser and :meth:`from_argv`)."""
        for name, d in cls.defaults().items():
            kw: dict[str, Any] = {"dest": name, "help": cls.HELP.get(name)}
            if name in cls.CHOICES:
                kw["choices"] = list(cls.CHOICES[name])
            if isinstance(d, bool) and name in cls.BARE:
                kw.update(action="store_true", default=d)
            elif isinstance(d, bool):
                kw.update(type=_switch, default=d, metavar="0|1")
            elif isinstance(d, tuple):
                kw.update(action="append", default=None)
            else:
                kw.update(type=type(d), default=d)
            if name in cls.REQUIRED:
                kw["required"] = True
            p.add_argument(flag(name), **kw)

    @classmethod
    def from_namespace(cls: type[_T], ns: argparse.Namespace) -> _T:
        """The value of a namespace that :meth:`add_to`'s options filled."""
        values: dict[str, Any] = {}
        for name, d in cls.defaults().items():
            v = getattr(ns, name)
            if isinstance(d, tuple):
                values[name] = tuple(_dashes(x) for x in v or ())
            else:
                values[name] = _dashes(v) if isinstance(d, str) else v
        return cls(**values)

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        import argparse

        p = argparse.ArgumentParser(prog="slurmfm-runtime", allow_abbrev=False)
        cls.add_to(p)
        return p

    @classmethod
    def from_argv(cls: type[_T], argv: Sequence[str]) -> _T:
        """The value that ``argv`` (options only, no subcommand) gives; exits 2 when wrong."""
        return cls.from_namespace(cls.parser().parse_args(list(argv)))

    @classmethod
    def from_words(cls: type[_T], words: Sequence[str]) -> tuple[_T, list[str]] | None:
        """The value of the options in ``words`` up to ``--``, and the words after it, read
        without ``argparse``; None for anything but what :meth:`to_argv` writes (a word
        before ``--`` that is no field's option, a value starting with ``-`` after a space, a
        value a field refuses, no ``--``), which the caller then gives to ``argparse``, whose
        reading and messages stay the reference.

        Why: a launch task on every node reads its options before its launcher starts, and
        ``argparse`` (with ``gettext``, and ``shutil`` for a parser with subcommands, which
        imports ``bz2`` and ``lzma``) was about a tenth of the node entry's CPU.
        """
        defaults = cls.defaults()
        by_flag = {flag(name): name for name in defaults}
        values: dict[str, Any] = {}
        lists: dict[str, list[str]] = {}
        i = 0
        try:
            while i < len(words):
                w = words[i]
                if w == "--":
                    break
                head, eq, text = w.partition("=")
                name = by_flag.get(head)
                if name is None:
                    return None
                d = defaults[name]
                if isinstance(d, bool) and name in cls.BARE:
                    if eq:
                        return None
                    values[name] = True
                    i += 1
                    continue
                if not eq:
                    if i + 1 >= len(words) or words[i + 1].startswith("-"):
                        return None
                    text = words[i + 1]
                    i += 1
                i += 1
                if name in cls.CHOICES and text not in cls.CHOICES[name]:
                    return None
                if isinstance(d, tuple):
                    lists.setdefault(name, []).append(text)
                elif isinstance(d, bool):
                    values[name] = _switch(text)
                else:
                    values[name] = type(d)(text)
        except ValueError:
            return None
        if i >= len(words) or any(name not in values for name in cls.REQUIRED):
            return None
        values.update((name, tuple(v)) for name, v in lists.items())
        return cls(**dict(defaults, **values)), list(words[i + 1 :])

    def changed(self) -> list[str]:
        """The fields whose value is not the default, in declaration order."""
        return [n for n, d in self.defaults().items() if getattr(self, n) != d]

    def words(self, name: str) -> list[str]:
        """The argv words of field ``name`` (nothing for an empty tuple or a bare switch off)."""
        value = getattr(self, name)
        if isinstance(value, bool) and name in self.BARE:
            return [flag(name)] if value else []
        out: list[str] = []
        for item in value if isinstance(value, tuple) else (value,):
            text = word(item)
            out.extend([flag(name) + "=" + text] if text.startswith("-") else [flag(name), text])
        return out

    def to_argv(self, always: Iterable[str] = ()) -> list[str]:
        """The words that :meth:`from_argv` turns back into this value: every field that is
        not its default, and those named in ``always`` (shown for the reader)."""
        shown = set(always) | set(self.changed()) | self.REQUIRED
        out: list[str] = []
        for name in self.defaults():
            if name in shown:
                out.extend(self.words(name))
        return out


class _Prepare(NamedTuple):
    # in the order the batch script shows them
    planned: str = ""
    rank_map: str = ""
    topo_addr: bool = False
    rdzv_port: int = 0
    tasks_per_node: int = 0
    spare_nodes: int = 0
    serve: str = "none"
    serve_nodes: int = 0
    serve_port: int = 0
    dist_port: int = -1
    serve_dp: int = 1
    pd_prefill: int = 0
    pd_decode: int = 0
    pd_span: int = 1
    pd_decode_span: int = 0
    pd_tp: str = ""
    pd_dp: str = ""
    port_base: int = 20000
    port_span: int = 6000
    stripe_layout: str = ""
    min_free_kb: int = 0
    min_free_gb: str = "0"
    runtime: str = ""
    bytecode: bool = True


class PrepareOptions(_Prepare, Options):
    """``prepare``: host order, ports, storage checks (:func:`.cli.prepare`)."""

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {
        "runtime": "this runtime's path (default: the running one)",
        "planned": "the planned host order (slurmfm plan, pin mode)",
        "rank_map": "HOST=KEY words: the planner's rank map",
        "topo_addr": "sort the hosts by each node's SLURM_TOPOLOGY_ADDR",
        "dist_port": "SGLang: 0 picks one, -1 none",
        "serve_dp": "SGLang: data-parallel ranks",
        "pd_prefill": "SGLang prefill/decode: the first N hosts serve prefill (.pd)",
        "pd_decode": "SGLang prefill/decode: the next N hosts serve decode",
        "pd_span": "SGLang prefill/decode: nodes of one (prefill) server",
        "pd_decode_span": "SGLang prefill/decode: nodes of one decode server (0: pd_span)",
        "pd_tp": "SGLang prefill/decode: PREFILL,DECODE servers' --tp (empty: in the command)",
        "pd_dp": "SGLang prefill/decode: PREFILL,DECODE servers' --dp-size",
        "tasks_per_node": "NeMo: tasks in host order",
        "spare_nodes": "the last K hosts stand by",
        "stripe_layout": "lfs setstripe arguments for the checkpoint directory",
        "min_free_gb": "min_free_kb as the recipe wrote it (for the message)",
        "bytecode": "the later steps run a copy with bytecode (install.with_bytecode)",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"serve": ("none", "all", "split", "hetjob")}


class _Health(NamedTuple):
    gpus: int = 0
    efa: int = 0
    dcgm: int = 0
    efa_tries: int = 3
    efa_delay_s: float = 5.0
    imex: bool = False


class HealthOptions(_Health, Options):
    """``health``: the node checks of the health gate (:func:`.health.check_node`)."""

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {
        "dcgm": "DCGM diagnostic level (0: none)",
        "imex": "the IMEX channel is needed",
    }
    BARE: ClassVar[frozenset[str]] = frozenset({"imex"})


class _Batch(NamedTuple):
    runtime: str = ""
    max_restarts: int = 3
    restart_in_job: bool = True
    supervise: bool = True
    hang_timeout_s: float = 1800.0
    startup_timeout_s: float = 3600.0
    requeue: bool = True
    expedite: bool = False
    requeue_tries: int = 3
    requeue_delay_s: float = 10.0
    requeue_away_s: float = 600.0
    retry_exit: str = "none"
    drain: bool = True
    hyperpod: bool = False
    hyperpod_marker: str = "/opt/sagemaker_cluster"
    health: bool = False
    gpus: int = 0
    efa: int = 0
    dcgm: int = 0
    imex: bool = False
    efa_tries: int = 3
    efa_delay_s: float = 5.0
    health_timeout_s: float = 600.0
    nccl_check: str = "off"
    nccl_timeout_s: float = 900.0
    save_protocol: bool = True
    resignal_s: float = 10.0
    container_forward: str = "none"
    container_forward_tasks: bool = False
    signal_grace_s: float = 2.0
    probe_timeout_s: float = 60.0
    stop_query_s: float = 3.0
    poll_s: float = 0.5
    done_check: str = "none"
    fabric_test: str = "off"
    fabric_cmd: str = "all_reduce_perf"
    fabric_args: str = ""
    fabric_floor_gbs: float = 0.0
    fabric_tasks: int = 1
    fabric_mpi: str = ""
    fabric_timeout_s: float = 1800.0
    observe: bool = False
    observe_job_json: str = "{}"
    observe_start_s: float = 30.0
    serve_words: int = 0
    serve_kind: str = ""
    serve_model: str = ""
    serve_replicas: int = 1
    serve_front: str = "server"
    health_path: str = "/health"
    ready_timeout_s: float = 1800.0
    ready_poll_s: float = 5.0
    unhealthy_timeout_s: float = 300.0
    secret: tuple[str, ...] = ()
    component: tuple[str, ...] = ()
    component_env: tuple[str, ...] = ()
    component_unset: tuple[str, ...] = ()


class BatchOptions(_Batch, Options):
    """``batch``: the batch step (:class:`.batch.Batch`); the launch command follows ``--``.

    The defaults are a default recipe's: slurmfm/recipe/schema.py ``Resilience`` takes its
    defaults from these fields, so a runtime started without an option does what a default
    recipe asks (``drain_unhealthy: true`` is ``--drain 1``).
    """

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {
        "runtime": "this runtime's path (default: the running one)",
        "restart_in_job": "relaunch inside the allocation when every node answers",
        "supervise": "a parent that outlives a kill",
        "hang_timeout_s": "0: no hang detection",
        "startup_timeout_s": "before a launch's first progress, instead of the hang timeout "
        "(0: the hang timeout from the start)",
        "expedite": "submitted with --requeue=expedite (a non-zero end sets Requeue=0 first)",
        "requeue_away_s": "keep trying while slurmctld is away",
        "retry_exit": "'any', 'none' or a comma list of exit codes (exits > 128 always retry)",
        "drain": "drain a node that fails its checks",
        "health": "run the health gate",
        "container_forward": "a launch in a container: on the save signal, send this to the "
        "training processes from a host step on every node (`forward`) instead of USR2 to "
        "the step",
        "container_forward_tasks": "the launch's tasks are the training processes (NeMo), "
        "not their children",
        "stop_query_s": "how long to wait for slurmctld at a TERM (the stop reason), before "
        "KillWait",
        "done_check": "none | marker | megatron:ITERS | megatron-log",
        "fabric_test": "nccl-tests all_reduce_perf before the attempt's first launch (.fabric)",
        "fabric_floor_gbs": "peak bus bandwidth floor in GB/s; 0: log the figures only",
        "fabric_tasks": "ranks per node (one per GPU)",
        "fabric_mpi": "srun --mpi for the test; empty: the cluster's MpiDefault",
        "serve_words": "the first N words of the command start the server",
        "serve_replicas": "model replicas behind the endpoint (the endpoint file lists them)",
        "serve_front": "what answers at the endpoint's URL with several replicas "
        "(server | dp-coordinator | dp-attention)",
        "secret": "a variable whose value the log masks",
        "component": "a heterogeneous component beyond the first: 'G nodes=N health=0|1 "
        "gpus=N efa=N imex=0|1'",
        "component_env": "G:NAME=VALUE",
        "component_unset": "G:NAME",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "nccl_check": ("off", "warn", "fail"),
        "fabric_test": ("off", "warn", "fail"),
        "container_forward": ("none",) + SIGNALS,
    }

    def health_options(self, gpus: int, efa: int, imex: bool) -> HealthOptions:
        """The ``health`` step's options for a component with these devices."""
        return HealthOptions(
            gpus=gpus,
            efa=efa,
            dcgm=self.dcgm,
            imex=imex,
            efa_tries=self.efa_tries,
            efa_delay_s=self.efa_delay_s,
        )


class _Node(NamedTuple):
    prefix: int = 0
    forward: str = "none"
    forward_tasks: bool = False
    order_var: str = "SLURMFM_HOST_ORDER"
    ray: str = ""
    ray_python: str = "python3"
    ray_port: str = "6379"
    ray_nodes: str = "1"
    ray_timeout_s: str = "300"
    numa: str = ""
    ray_driver: bool = False
    vllm: str = ""
    vllm_dp: int = 1
    vllm_dp_local: int = 1
    pd: str = ""
    pd_router_python: str = "python3"
    pd_router_arg: tuple[str, ...] = ()
    pd_startup_s: int = 1800


class NodeOptions(_Node, Options):
    """``node``: the per-node entry of a launch step (:func:`.node.main`)."""

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {
        "prefix": "words of the command after which --node-rank goes (0: none)",
        "forward_tasks": "signal the launched process itself (NeMo)",
        "order_var": "where the host order is",
        "ray": "vLLM across nodes, or a Ray cluster (ray_driver): the ray command",
        "ray_port": "the Ray head's GCS port; rdzv: the job's rendezvous port (a Ray cluster)",
        "ray_driver": "a Ray cluster (launcher ray): the launch is its driver, on the head",
        "numa": "torchrun --numa-binding mode where the launch's torch has it (.numa); empty: none",
        "vllm": "vLLM across nodes: native (--nnodes/--headless), ray, or auto (.vllm's gate)",
        "vllm_dp": "vLLM data-parallel replicas (--data-parallel-size)",
        "vllm_dp_local": "vLLM replicas on each node (--data-parallel-size-local)",
        "pd": "SGLang prefill/decode: the KV transfer backend (.pd; empty: not disaggregated)",
        "pd_router_python": "SGLang prefill/decode: the python of the router (node 0)",
        "pd_router_arg": "SGLang prefill/decode: one more router argument",
        "pd_startup_s": "SGLang prefill/decode: the router's wait for its servers",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "forward": ("none",) + SIGNALS,
        "numa": ("", "node"),
        "vllm": ("", "auto", "native", "ray"),
        "pd": ("", "mooncake", "nixl"),
    }
    BARE: ClassVar[frozenset[str]] = frozenset({"ray_driver"})

    def ray_settings(self) -> dict[str, str] | None:
        """What :func:`.node.main` needs to start Ray first (None: no Ray)."""
        if not self.ray:
            return None
        return {
            "ray": self.ray,
            "python": self.ray_python,
            "port": self.ray_port,
            "nodes": self.ray_nodes,
            "timeout": self.ray_timeout_s,
            "driver": "1" if self.ray_driver else "",
        }


class _Forward(NamedTuple):
    signal: str = "TERM"
    poll_s: float = 2.0
    tasks: bool = False


class ForwardOptions(_Forward, Options):
    """``forward``: signal the workers of this node's launch step until it ends."""

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {
        "poll_s": "how often to look for new workers",
        "tasks": "signal the tasks, not their children",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"signal": SIGNALS}
    BARE: ClassVar[frozenset[str]] = frozenset({"tasks"})


class _ContainerRemove(NamedTuple):
    name: str = ""
    earlier: bool = False


class ContainerRemoveOptions(_ContainerRemove, Options):
    """``container-remove``: remove this node's named container (:func:`.node.container_remove`)."""

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {
        "name": "the Pyxis --container-name",
        "earlier": "the job's earlier attempts' containers of the same role instead",
    }
    REQUIRED: ClassVar[frozenset[str]] = frozenset({"name"})
    BARE: ClassVar[frozenset[str]] = frozenset({"earlier"})


class _Task(NamedTuple):
    script: str = ""


class TaskOptions(_Task, Options):
    """``task``: this array task's values from the script's sweep table (:mod:`.sweep`)."""

    __slots__ = ()
    HELP: ClassVar[dict[str, str]] = {"script": "the running batch script ($0)"}
    REQUIRED: ClassVar[frozenset[str]] = frozenset({"script"})
