"""A tool's refusal: it cannot do what was asked, and its message tells the model what to do instead."""


class Refused(Exception):
    """A tool cannot do what was asked; the message tells the model what to do instead."""
