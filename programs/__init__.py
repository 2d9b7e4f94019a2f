"""DSPy modules that compose signatures into pipelines."""
