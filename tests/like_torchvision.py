"""Checks shared by the tests that hold fastload's transforms to torchvision's behaviour."""
import pytest


def raises_like_torchvision(ours, theirs):
    """``theirs()`` raises; ``ours()`` raises the same exception type."""
    with pytest.raises(Exception) as tv_err:
        theirs()
    with pytest.raises(tv_err.type):
        ours()
