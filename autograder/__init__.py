"""Lesson 83 homework package: release builder, test definitions and grading code."""
