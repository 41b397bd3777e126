"""The bottom layer: where files live (local paths and URIs), one vocabulary for every layer."""

from dppipeline.storage.location import (
    Location,
    StorageError,
    display,
    is_remote,
    is_uri,
    remote_filesystems,
)

__all__ = ["Location", "StorageError", "display", "is_remote", "is_uri", "remote_filesystems"]
