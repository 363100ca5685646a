"""Warnings that point at the user's line, not at the library frame that noticed the problem."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Optional, Type

_OURS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_THEIRS = (os.sep + os.path.join("nvidia", "dali") + os.sep, os.sep + os.path.join("torch", ""))


def _outside(filename: str) -> bool:
    return not filename.startswith(_OURS) and not any(part in filename for part in _THEIRS)


def warn_user(message: str, category: Type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the innermost calling frame outside dali_shards, DALI and
    torch: the user's line that led to it."""
    frame: Optional[FrameType] = sys._getframe(1)
    level = 2  # stacklevel 2: warn_user's caller
    while frame is not None and not _outside(os.path.abspath(frame.f_code.co_filename)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
