"""fastload's exceptions."""
import errno

#: errno values that are the process's limits, not a file's fault: out of descriptors or memory. A read failing
#: with one raises whatever on_error says (skipping would replace good samples, or drop them from a folder scan).
PROCESS_LIMITS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_LIMIT_HINT = ("a limit of the process, not a fault of the sample: raise the open-file limit (ulimit -n), close "
               "files, or free memory")


def process_limit_error(message):
    """The OSError for a sample read that failed on a PROCESS_LIMITS errno; ``message`` names the sample. Marked
    (``process_limit``), so that code it passes through again knows it for one (its errno is not kept)."""
    error = OSError(f"{message} ({_LIMIT_HINT})")
    error.process_limit = True
    return error


def is_process_limit(e):
    """Whether an exception is the process's limit: an OSError of PROCESS_LIMITS (or one process_limit_error made),
    or a MemoryError."""
    return isinstance(e, MemoryError) or (isinstance(e, OSError) and (e.errno in PROCESS_LIMITS
                                                                      or getattr(e, "process_limit", False)))


def raise_process_limit(e, doing):
    """Raises process_limit_error if ``e`` is one of PROCESS_LIMITS (``doing``: what failed, naming the path), so a
    caller that would skip the file or folder stops instead; returns otherwise."""
    if is_process_limit(e):
        raise process_limit_error(f"{doing}: {e.strerror}") from None


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
