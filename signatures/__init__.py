"""DSPy signatures: what each LLM step takes and returns, one file per task family."""
