"""User-facing errors: the CLI prints the message on one line and exits with code 2."""


class MeshplanError(ValueError):
    """Bad input named in one sentence (unknown preset, malformed file, impossible plan)."""
