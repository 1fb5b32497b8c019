"""Exports of a meshplan Job to other frameworks' configs, and imports back.

Each exporter is a pure function ``export_<target>(job) -> Export``: the text of the target's
config plus the warnings for choices it maps approximately. A choice the target cannot express
raises MeshplanError naming it (the CLI prints it and exits 2). Importers turn a Megatron-LM
command line, Megatron-Bridge overrides or a torchtitan command line / TOML back into a Job.
"""

from meshplan.export.common import Export, ExportTarget, export_job

__all__ = ["Export", "ExportTarget", "export_job"]
