"""Authoring: the question sources read into questions and cases, their expected values and the graded suite."""
