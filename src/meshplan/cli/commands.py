"""Imports every command module so that each registers on the app (one line per command)."""

from meshplan.cli import models_cmd  # noqa: F401
from meshplan.cli import estimate_cmd  # noqa: F401
from meshplan.cli import validate_cmd  # noqa: F401
from meshplan.cli import plan_cmd, explain_cmd  # noqa: F401
from meshplan.cli import train_cmd  # noqa: F401
from meshplan.cli import replan_cmd  # noqa: F401
