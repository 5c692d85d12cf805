"""fastload's exceptions."""


class DecodeError(ValueError):
    """A sample's bytes could not be decoded into an image. The message names the sample and says why."""

    def __init__(self, message, sample=None, reason=None):
        super().__init__(message)
        self.sample = sample
        self.reason = reason
