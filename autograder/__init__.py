"""The homework package: the release builder, test definitions and grading code; it knows no lesson."""
