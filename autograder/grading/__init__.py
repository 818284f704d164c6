"""The grading stage: reading a class folder, judging each submission, storing results and grades, merging."""
