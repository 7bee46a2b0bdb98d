"""Observability: per-node job metrics for Prometheus (node_exporter's textfile collector),
GPU-to-job mapping for DCGM-Exporter, EFA counter snapshots, the Grafana dashboard, and the
``slurmfm report``/``slurmfm logs`` views of a job.

``agent`` runs on the job's nodes (standard library only, embedded in the job script);
``report``, ``logs`` and ``dashboard`` run where slurmfm is installed.
"""
