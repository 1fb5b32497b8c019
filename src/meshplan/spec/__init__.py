"""Descriptions of what is trained (model, training setup) and where (cluster)."""

from meshplan.spec.cluster import ClusterSpec, GPUSpec, resolve_cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.presets import model_names, model_preset, resolve_model
from meshplan.spec.training import Optimizer, Precision, TrainingSpec

__all__ = [
    "ClusterSpec", "GPUSpec", "ModelSpec", "Optimizer", "Precision", "TrainingSpec",
    "model_names", "model_preset", "resolve_cluster", "resolve_model",
]
