"""Loaders that turn FABLES, BooookScore, NovelQA and DiverseSumm files into pydantic records and
`dspy.Example` sets split by book."""
