"""Hand-built run directories with known answers, for the ``analysis`` tests."""
