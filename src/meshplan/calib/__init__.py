"""Calibration: the layer above spec/, plan/ and cost/ that turns measurements into the cost
model's inputs (no torch).

* hardware profiles (``meshplan profile``'s JSON): ``hwprofile`` (format, measured rates),
  ``hwfit`` (curve and alpha-beta fits), ``layer_probe`` (the probe jobs), ``hwcalib`` (the
  Calibration factors a profile determines);
* published training runs: ``validate`` (rows, predicted vs published), ``fit`` (grid search
  of the factors, ``meshplan validate --fit``);
* one training run: ``predict`` (predicted vs measured).
"""
