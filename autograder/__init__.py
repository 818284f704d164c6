"""The homework package: the release builder, test definitions and grading code; it knows no lesson."""

COMMAND = "lesson83"  # the package's command (pyproject.toml [project.scripts]); the one place its name is spelled
ENV_PREFIX = COMMAND.upper() + "_"  # every environment variable the package reads starts with it


def env_name(suffix: str) -> str:
    """The environment variable for a setting: env_name("CACHE") == "LESSON83_CACHE"."""
    return ENV_PREFIX + suffix
