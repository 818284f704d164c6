"""What the tests share: helpers, fixtures and data that more than one test file uses (a test file never imports
another test file; tests/README.md)."""
