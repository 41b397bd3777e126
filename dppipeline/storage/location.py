"""Where files live: local paths and URIs of object stores and HDFS, through pyarrow.fs.

A `Location` is a local path (plain, or `file://`) or a URI: `s3://`, `gs://`, `hdfs://`,
`abfs://` (and whatever else `pyarrow.fs.FileSystem.from_uri` knows). Credentials come from
where each client library looks (AWS_* / instance roles for S3, application default
credentials for GCS, the Hadoop configuration for HDFS, AZURE_* for ADLS); a location never
holds one: a URI that carries a secret (`key:secret@bucket`, `?secret_key=...`) is refused,
since the product writes the locations it used into the ledger and its logs. `display()` also
drops the user and the query string, a second guard for what is shown.

Local locations keep using the operating system directly where the product relies on POSIX
(atomic rename, fsync, modes 0600/0700); this module gives everything else one vocabulary.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from dppipeline.errors import UsageError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

LOCAL_SCHEMES = ("", "file")
# Schemes pyarrow.fs reads; `gcs` and `gs` are the same store, as are `abfs` and `abfss`.
# `s3a` is Hadoop's name for S3 (Spark clusters use it): the same store to pyarrow.
REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "az")


class StorageError(OSError):
    """A store refused or failed an operation; the message names the location."""


class LocationError(UsageError, ValueError):
    """A location no run may use (an unknown scheme, credentials in the URI): a usage error
    (exit 2) in one line wherever the location was given (a flag, a spec, the API); still a
    ValueError for callers that check a location's syntax."""


# An engine's own access to remote stores for the duration of a run (the Spark engine: Hadoop's
# FileSystem API), instead of pyarrow's clients: URI -> (file system, path within it).
Resolver = Callable[[str], "tuple[pafs.FileSystem, str]"]
_resolver: ContextVar[Resolver | None] = ContextVar("dppipeline_storage_resolver", default=None)


@contextmanager
def remote_filesystems(resolver: Resolver | None) -> Iterator[None]:
    """Within the block, remote locations resolve through `resolver` (None: pyarrow's)."""
    token = _resolver.set(resolver)
    try:
        yield
    finally:
        _resolver.reset(token)


@dataclass(frozen=True)
class Location:
    """A file or folder, local or remote; `uri` is normalised (local: absolute path; remote:
    `scheme://bucket/key` without a trailing slash)."""

    uri: str

    @staticmethod
    def of(where: str | os.PathLike[str] | Location) -> Location:
        if isinstance(where, Location):
            return where
        text = os.fspath(where)
        scheme = _scheme(text)
        if scheme == "file":
            return Location(str(Path(urlsplit(text).path).absolute()))
        if scheme == "":
            return Location(str(Path(text).absolute()))
        if scheme not in REMOTE_SCHEMES:
            raise LocationError(
                f"{display(text)}: unknown storage scheme {scheme!r} (known: a local path, "
                f"file://, {', '.join(s + '://' for s in REMOTE_SCHEMES)})"
            )
        _refuse_secrets(text)
        return Location(text.rstrip("/") if text.rstrip("/") != f"{scheme}:/" else text)

    @property
    def is_local(self) -> bool:
        return _scheme(self.uri) in LOCAL_SCHEMES

    @property
    def path(self) -> Path:
        """The local path (only for a local location)."""
        if not self.is_local:
            raise ValueError(f"{self.display()} is not a local path")
        return Path(self.uri)

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        if self.is_local:
            return Location(str(self.path.parent))
        head, _, _ = self.uri.rstrip("/").rpartition("/")
        return Location(head) if "://" in head and not head.endswith(":/") else self

    def join(self, *parts: str) -> Location:
        if self.is_local:
            return Location(str(self.path.joinpath(*parts)))
        return Location("/".join([self.uri.rstrip("/"), *(p.strip("/") for p in parts)]))

    def display(self) -> str:
        return display(self.uri)

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:  # a local location is a path to libraries that take one
        return str(self.path)

    # -- the file system ---------------------------------------------------------------------

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """(pyarrow file system, the path within it)."""
        import pyarrow.fs as pafs  # noqa: PLC0415 (pyarrow.fs loads its clients lazily)

        if self.is_local:
            return pafs.LocalFileSystem(), self.uri
        resolver = _resolver.get()
        try:
            return resolver(self.uri) if resolver is not None else _remote(self.uri)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ValueError ...
            raise StorageError(f"{self.display()}: {_first_line(exc)}") from None

    def info(self) -> pafs.FileInfo:
        fs, path = self.filesystem()
        return _call(self, fs.get_file_info, path)

    def exists(self) -> bool:
        import pyarrow.fs as pafs  # noqa: PLC0415

        return bool(self.info().type != pafs.FileType.NotFound)

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs  # noqa: PLC0415

        return bool(self.info().type == pafs.FileType.Directory)

    def is_file(self) -> bool:
        import pyarrow.fs as pafs  # noqa: PLC0415

        return bool(self.info().type == pafs.FileType.File)

    def children(self) -> list[tuple[Location, pafs.FileInfo]]:
        """Entries directly under this folder, sorted by name."""
        import pyarrow.fs as pafs  # noqa: PLC0415

        fs, path = self.filesystem()
        found = _call(self, fs.get_file_info, pafs.FileSelector(path, recursive=False))
        return sorted(
            ((self.join(info.base_name), info) for info in found), key=lambda e: e[0].name
        )

    def files(self) -> list[str]:
        """Every file under this folder, as paths relative to it, sorted."""
        import pyarrow.fs as pafs  # noqa: PLC0415

        fs, path = self.filesystem()
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        found = _call(self, fs.get_file_info, selector)
        prefix = path.rstrip("/") + "/"
        return sorted(
            info.path.removeprefix(prefix) for info in found if info.type == pafs.FileType.File
        )

    def read_bytes(self) -> bytes:
        fs, path = self.filesystem()
        with _call(self, fs.open_input_stream, path) as stream:
            return bytes(_call(self, stream.read))

    def read_head(self, size: int) -> bytes:
        """The first `size` bytes (fewer for a shorter file): a header, without the rest."""
        fs, path = self.filesystem()
        with _call(self, fs.open_input_stream, path) as stream:
            return bytes(_call(self, stream.read, size))

    def write_bytes(self, data: bytes) -> None:
        """One object written whole: on an object store a single PUT, visible all at once or
        not at all (the publication protocol's commit relies on it)."""
        fs, path = self.filesystem()
        with _call(self, fs.open_output_stream, path) as stream:
            _call(self, stream.write, data)

    def delete_tree(self) -> None:
        """This folder and everything under it (nothing if it does not exist)."""
        fs, path = self.filesystem()
        if self.exists():
            _call(self, fs.delete_dir, path)

    def delete_file(self) -> None:
        fs, path = self.filesystem()
        if self.exists():
            _call(self, fs.delete_file, path)


def is_remote(where: str | os.PathLike[str] | Location) -> bool:
    return not Location.of(where).is_local


def is_uri(text: str) -> bool:
    """Does `text` name a scheme (`s3://...`, `file://...`) rather than a plain path?"""
    return _scheme(text) != ""


def display(uri: str) -> str:
    """A URI as the product shows it: no user, password or query (they may carry secrets)."""
    if _scheme(uri) in LOCAL_SCHEMES:
        return uri
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_SECRET_WORDS = ("key", "secret", "token", "password", "credential", "sas", "sig")


def _refuse_secrets(uri: str) -> None:
    """Credentials belong in the environment, an instance role or the Hadoop configuration."""
    parts = urlsplit(uri)
    if parts.password is not None or (parts.username and parts.scheme != "hdfs"):
        raise LocationError(
            f"{display(uri)}: credentials in a URI are refused (they would be recorded with "
            "the location); use the store's usual places: AWS_* variables, an instance role, "
            "GOOGLE_APPLICATION_CREDENTIALS, AZURE_* variables or the Hadoop configuration"
        )
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if any(word in name.lower() for word in _SECRET_WORDS):
            raise LocationError(
                f"{display(uri)}: option {name!r} in a URI is refused (it may hold a secret, "
                "and locations are recorded); set it in the environment instead"
            )


def _scheme(text: str) -> str:
    head, sep, _ = text.partition("://")
    if not sep or "/" in head or len(head) < 2:  # `C:/...` is not a scheme
        return ""
    return head.lower()


@functools.lru_cache(maxsize=32)
def _remote_fs(scheme_and_host: str) -> pafs.FileSystem:
    import pyarrow.fs as pafs  # noqa: PLC0415

    fs, _ = pafs.FileSystem.from_uri(scheme_and_host + "/")
    return fs


def _remote(uri: str) -> tuple[pafs.FileSystem, str]:
    """One file system per store (bucket or namenode), reused: creating an S3 client resolves
    the region and credentials."""
    import pyarrow.fs as pafs  # noqa: PLC0415

    if uri.startswith("s3a://"):
        uri = "s3://" + uri.removeprefix("s3a://")
    parts = urlsplit(uri)
    if parts.query or "@" in parts.netloc or parts.scheme not in ("s3", "gs", "gcs", "hdfs"):
        found: tuple[pafs.FileSystem, str] = pafs.FileSystem.from_uri(uri)
        return found  # options or accounts in the URI: pyarrow reads them
    fs = _remote_fs(f"{parts.scheme}://{parts.netloc}")
    if parts.scheme == "hdfs":
        return fs, parts.path or "/"
    return fs, (parts.netloc + parts.path).rstrip("/")


def _call(where: Location, function, *args):  # type: ignore[no-untyped-def]
    try:
        return function(*args)
    except StorageError:
        raise  # already names the location (an engine's file system raised it)
    except FileNotFoundError:
        raise StorageError(f"{where.display()}: does not exist") from None
    except Exception as exc:
        raise StorageError(f"{where.display()}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
