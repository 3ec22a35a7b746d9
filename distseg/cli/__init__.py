"""The console entry points, one thin module per command."""
