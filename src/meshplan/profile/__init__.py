"""Torch micro-benchmarks of the local devices -> a hardware profile (meshplan.calib.hwprofile).

compute.py: matmul / attention / memory bandwidth on one device; collectives.py: torch.distributed
collectives over a process group this package launches itself; run.py: the whole profile.
Only this package and meshplan.runtime import torch; the CLI imports it inside the command.
"""
