"""Hidden reference solutions for Lesson 83 (never shipped to students)."""
