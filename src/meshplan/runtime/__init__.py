"""Execute a meshplan Job on PyTorch distributed (imports torch; the planner never imports this).

Layout: ``models/`` reference Transformers built from a ModelSpec; ``mesh.py`` the DeviceMesh;
``parallelize.py`` applies a Plan (TP, CP, EP, activation checkpointing, data parallel, in that
order); ``train.py`` the loop (its settings ``train_config.py``, a step's micro-batches and loss
``microbatch.py``, the rank's device and precision ``device.py``, the optimizer ``optim.py``);
``worker.py`` the torchrun entry point; ``launch.py`` starts torchrun.
"""
