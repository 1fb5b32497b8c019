"""Every file meshplan reads goes through a ``from_dict``: with any one field replaced by any JSON
value (or one field added), it either builds or raises MeshplanError; never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.ckpt_meta import CheckpointFile, CheckpointMeta
from meshplan.errors import MeshplanError
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import ClusterSpec, system_preset
from meshplan.spec.model import ModelSpec
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

JOB = Job(model=model_preset("gpt2"), training=TrainingSpec(seq_len=1024, global_batch=32),
          cluster=system_preset("dgx-a100"), plan=Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=3, sp=True))
META = CheckpointMeta(step=4, data_position=32, data_seed=0, world_size=8, job=JOB,
                      files=(CheckpointFile(name=".metadata", size_bytes=10),))
SUBJECTS = {
    "job": (JOB.to_dict(), Job.from_dict),
    "cluster": (system_preset("dgx-h100").to_dict(), ClusterSpec.from_dict),
    "cluster-short": ({"system": "dgx-h100", "num_nodes": 2}, ClusterSpec.from_dict),
    "model": (model_preset("llama3-8b").to_dict(), ModelSpec.from_dict),
    "training": (JOB.training.to_dict(), TrainingSpec.from_dict),
    "checkpoint": (META.to_dict(), CheckpointMeta.from_dict),
}
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                        st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, path + (k,))
    elif isinstance(d, list) and d:
        for i, v in enumerate(d):
            yield from _paths(v, path + (i,))
    else:
        yield path


@pytest.mark.parametrize("subject", sorted(SUBJECTS))
@settings(max_examples=150, deadline=None)
@given(pick=st.integers(min_value=0), value=JSON_VALUES, add=st.booleans())
def test_any_field_any_value_is_built_or_refused(subject, pick, value, add):
    good, parse = SUBJECTS[subject]
    data = json.loads(json.dumps(good))
    paths = list(_paths(data))
    where = paths[pick % len(paths)]
    node = data
    for key in where[:-1]:
        node = node[key]
    if add and isinstance(node, dict):
        node["not_a_field"] = value
    else:
        node[where[-1]] = value
    try:
        built = parse(data)
    except MeshplanError:
        return
    if subject == "job":  # a Job that builds must also cost
        from meshplan.cost import estimate

        estimate(built.model, built.cluster, built.training, built.plan)
