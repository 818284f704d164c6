"""Limits shared by the grader's modules, each defined once: the 64 MiB cap and the defaults of
grading_config.yaml's limits (autograder/config.py) and of a sandboxed run (execute.Limits).

Imports nothing: the sandbox runs with this module (execute.py and wire.py import it there).
"""

MIB = 2**20

# The cap on anything a submission hands over in one piece: a notebook the sandbox runs (submissions.
# max_notebook_mb may only lower it), a file it writes, the probe results it sends back (the wire's message
# cap), an uploaded milestone.pt.
UPLOAD_CAP_MB = 64

# One submission's run in the sandbox: defaults of grading_config.yaml's `execution` section and of execute.Limits.
CELL_TIMEOUT_S = 20.0
WALL_TIMEOUT_S = 60.0
CPU_TIMEOUT_S = 60
MEMORY_MB = 4096
MAX_PROCESSES = 64
MAX_OUTPUT_KB = 256

# The child process that loads and evaluates an uploaded milestone.pt (submissions.checkpoint_memory_mb).
CHECKPOINT_MEMORY_MB = 1024
