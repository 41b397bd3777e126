"""The Beam side of the Python API: `ReleaseTransform` (imports apache_beam)."""

from dppipeline.api.beam_transform import ReleaseTransform

__all__ = ["ReleaseTransform"]
