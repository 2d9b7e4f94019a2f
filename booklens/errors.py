"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""


class BooklensError(Exception):
    """A problem with the input, the configuration or the backend that the user can fix."""


class LMError(BooklensError):
    """A permanent backend failure: bad key, unknown model, prompt larger than the context."""
