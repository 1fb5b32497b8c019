"""PyTorch side of meshplan: runs a Job (imports torch; the planner never imports this package)."""
