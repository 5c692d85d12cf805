"""fastload's exceptions."""


class DecodeError(ValueError):
    """A sample's bytes could not be decoded into an image. The message names the sample and says why."""

    def __init__(self, message, sample=None, reason=None):
        super().__init__(message)
        self.sample = sample
        self.reason = reason

    def detail(self):
        """The message without the sample's name it starts with, for a caller that names the sample itself."""
        message, prefix = str(self), f"{self.sample}: "
        return message[len(prefix):] if self.sample is not None and message.startswith(prefix) else message
