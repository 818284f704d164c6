"""The checks runtime shipped next to every lesson's checks module (checks_runtime.py)."""
