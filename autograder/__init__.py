"""The homework package: the release builder, test definitions and grading code; it knows no lesson."""

COMMAND = "lesson83"  # the package's command (pyproject.toml [project.scripts]); the one place its name is spelled
ENV_PREFIX = COMMAND.upper() + "_"  # every environment variable the package reads starts with it
MIB = 2**20
# The cap on anything a submission hands over in one piece: a notebook the sandbox runs (submissions.max_notebook_mb
# may only lower it), a file it writes, the probe results it sends back (the wire's message cap), an uploaded
# checkpoint file. Here, below every module that uses it (the wire and the sandbox's limits).
UPLOAD_CAP_MB = 64


def env_name(suffix: str) -> str:
    """The environment variable for a setting: env_name("CACHE") == "LESSON83_CACHE"."""
    return ENV_PREFIX + suffix
