"""meshplan: find, estimate and run parallel training plans for Transformers.

The planner side (``spec``, ``plan``, ``cost``, ``search``, ``export``, ``report``, ``cli``) is pure
Python + NumPy; only ``runtime`` and ``profile`` import torch.
"""

__version__ = "0.1.0"
