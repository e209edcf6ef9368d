"""placeholder"""
from __future__ import annotations


class ProfileCapture:
    def close(self) -> None:
        pass
