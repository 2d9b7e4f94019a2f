"""Scores and agreement with human annotations: BooookScore, claim-label F1, QA accuracy."""
