"""Execute a meshplan Job on PyTorch distributed (imports torch; the planner never imports this).

Layout: ``models/`` reference Transformers built from a ModelSpec; ``mesh.py`` the DeviceMesh;
``parallelize.py`` applies a Plan (TP, CP, EP, activation checkpointing, data parallel, in that
order); ``train.py`` the loop; ``worker.py`` the torchrun entry point; ``launch.py`` starts torchrun.
"""
