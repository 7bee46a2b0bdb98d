"""Former home of Slurm's topology formats, now one module per job; names re-exported here.

The code moved (each module's docstring says why it exists):

* :mod:`slurmfm.topology.hostlist`: Slurm hostlists and ``--nodelist``;
* :mod:`slurmfm.topology.slurm_model`: block/switch order, switch names and block shapes that
  the model records of Slurm's files;
* :mod:`slurmfm.topology.topology_conf`: ``topology.conf`` (tree and block), read and written;
* :mod:`slurmfm.topology.topology_yaml`: ``topology.yaml`` (Slurm >= 25.05), read and written;
* :mod:`slurmfm.topology.scontrol`: ``scontrol show topology`` and ``sinfo`` node states.

Why keep this module: ``slurmfm topology export`` and ``scripts/bench_topology.py`` still import
it, and branches in flight may too. New code imports from the modules above.
"""

from slurmfm.topology.hostlist import collect_hostlist, compress_hostlist, expand_hostlist
from slurmfm.topology.model import natural_key
from slurmfm.topology.scontrol import normalize_state, parse_scontrol_topology, slurm_node_states
from slurmfm.topology.slurm_model import (
    BLOCK_ORDER_PREFIX,
    SWITCH_ORDER_PREFIX,
    block_order,
    block_sizes_for,
    block_topology,
    switch_order,
)
from slurmfm.topology.topology_conf import export_block, export_tree, parse_topology_conf
from slurmfm.topology.topology_yaml import (
    Ring,
    TopologyYaml,
    Torus,
    export_yaml,
    export_yaml_doc,
    parse_topology_yaml,
    read_topology_yaml,
)

__all__ = [
    "BLOCK_ORDER_PREFIX",
    "SWITCH_ORDER_PREFIX",
    "Ring",
    "TopologyYaml",
    "Torus",
    "block_order",
    "block_sizes_for",
    "block_topology",
    "collect_hostlist",
    "compress_hostlist",
    "expand_hostlist",
    "export_block",
    "export_tree",
    "export_yaml",
    "export_yaml_doc",
    "natural_key",
    "normalize_state",
    "parse_scontrol_topology",
    "parse_topology_conf",
    "parse_topology_yaml",
    "read_topology_yaml",
    "slurm_node_states",
    "switch_order",
]
