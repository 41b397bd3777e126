"""Hadoop's FileSystem API as a pyarrow file system, for the Spark engine's driver.

With the Spark engine, every remote location the run touches (listing the input's daily
partitions, their sizes and times for the release key, Parquet footers, CSV headers, the
upload of the release and its pointer) goes through the JVM's `org.apache.hadoop.fs.FileSystem`
of the session's Hadoop configuration: whatever the cluster can read (`s3a://` with hadoop-aws,
`gs://` with the GCS connector, `hdfs://`, `viewfs://`, `abfs://`), with its credentials, and
nothing the Python side would have to be configured for separately. `HadoopFileSystem` is a
`pyarrow.fs.FileSystemHandler`; `dppipeline.storage.remote_filesystems` routes a run's remote
locations to it. Bytes cross py4j: fine for footers, headers and a release's few files, not
for bulk data (Spark's executors read that themselves).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from dppipeline.storage import StorageError

CHUNK = 1 << 20  # bytes per py4j call when reading or writing a stream


class HadoopFileSystem(pafs.FileSystemHandler):  # type: ignore[misc]
    """Paths are full URIs (`viewfs://cluster/data/x.parquet`)."""

    def __init__(self, spark: Any) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    # -- helpers --------------------------------------------------------------------------------

    def _fs_and_path(self, uri: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        try:
            return path.getFileSystem(self._conf), path
        except Exception as exc:  # py4j: the JVM's exception, e.g. no FileSystem for a scheme
            reason = _java_reason(exc)
            if "No FileSystem for scheme" in reason:
                reason = no_connector(uri.partition("://")[0])
            raise StorageError(f"{uri}: {reason}") from None

    def _info(self, status: Any, uri: str | None = None) -> pafs.FileInfo:
        where = uri if uri is not None else str(status.getPath().toString())
        kind = pafs.FileType.Directory if status.isDirectory() else pafs.FileType.File
        size = None if status.isDirectory() else int(status.getLen())
        return pafs.FileInfo(
            where, kind, size=size, mtime_ns=int(status.getModificationTime()) * 10**6
        )

    # -- FileSystemHandler --------------------------------------------------------------------

    def get_type_name(self) -> str:
        return "hadoop"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        found = []
        for uri in paths:
            fs, path = self._fs_and_path(uri)
            try:
                found.append(self._info(fs.getFileStatus(path), uri))
            except Exception as exc:
                if "FileNotFoundException" not in _java_reason(exc, full=True):
                    raise StorageError(f"{uri}: {_java_reason(exc)}") from None
                found.append(pafs.FileInfo(uri, pafs.FileType.NotFound))
        return found

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        fs, path = self._fs_and_path(selector.base_dir)
        if not fs.exists(path):
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(selector.base_dir)
        base = selector.base_dir.rstrip("/")
        found, pending = [], [(path, base)]
        while pending:
            folder, shown = pending.pop()
            for status in fs.listStatus(folder):
                uri = f"{shown}/{status.getPath().getName()}"
                found.append(self._info(status, uri))
                if selector.recursive and status.isDirectory():
                    pending.append((status.getPath(), uri))
        return found

    def create_dir(self, path: str, recursive: bool) -> None:
        fs, where = self._fs_and_path(path)
        fs.mkdirs(where)

    def delete_dir(self, path: str) -> None:
        fs, where = self._fs_and_path(path)
        fs.delete(where, True)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        fs, where = self._fs_and_path(path)
        for status in fs.listStatus(where):
            fs.delete(status.getPath(), True)

    def delete_root_dir_contents(self) -> None:
        raise StorageError("refusing to empty a file system's root")

    def delete_file(self, path: str) -> None:
        fs, where = self._fs_and_path(path)
        fs.delete(where, False)

    def move(self, src: str, dest: str) -> None:
        fs, where = self._fs_and_path(src)
        fs.rename(where, self._jvm.org.apache.hadoop.fs.Path(dest))

    def copy_file(self, src: str, dest: str) -> None:
        self.open_output_stream(dest, {}).write(self.open_input_stream(src).read())

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(io.BytesIO(self._read_all(path)), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        """Random access (a Parquet footer is read from the end): only the ranges asked for
        cross py4j, never the whole file."""
        fs, where = self._fs_and_path(path)
        size = int(fs.getFileStatus(where).getLen())
        return pa.PythonFile(_HadoopReader(fs.open(where), size), mode="r")

    def open_output_stream(self, path: str, metadata: dict[str, str]) -> pa.NativeFile:
        return pa.PythonFile(_HadoopWriter(self, path), mode="w")

    def open_append_stream(self, path: str, metadata: dict[str, str]) -> pa.NativeFile:
        raise StorageError(f"{path}: appending is not supported")

    # -- bytes over py4j ----------------------------------------------------------------------

    def _read_all(self, uri: str) -> bytes:
        fs, path = self._fs_and_path(uri)
        stream = fs.open(path)
        try:
            chunks = []
            while chunk := stream.readNBytes(CHUNK):  # byte[] comes back as bytes
                chunks.append(bytes(chunk))
            return b"".join(chunks)
        finally:
            stream.close()

    def write_all(self, uri: str, data: bytes) -> None:
        fs, path = self._fs_and_path(uri)
        stream = fs.create(path, True)
        try:
            for start in range(0, len(data), CHUNK):
                stream.write(bytearray(data[start : start + CHUNK]))
        finally:
            stream.close()


class _HadoopReader(io.RawIOBase):
    """A seekable reader over an FSDataInputStream."""

    def __init__(self, stream: Any, size: int) -> None:
        self._stream, self._size, self._position = stream, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        wanted = min(len(buffer), self._size - self._position)
        if wanted <= 0:
            return 0
        self._stream.seek(self._position)
        data = bytes(self._stream.readNBytes(wanted))  # byte[] comes back as bytes
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


class _HadoopWriter(io.RawIOBase):
    """Collects what pyarrow writes and creates the file in one go on close."""

    def __init__(self, handler: HadoopFileSystem, uri: str) -> None:
        self._handler, self._uri, self._buffer = handler, uri, io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._buffer.write(bytes(data))

    def close(self) -> None:
        if not self.closed:
            self._handler.write_all(self._uri, self._buffer.getvalue())
        super().close()


def no_connector(scheme: str) -> str:
    """What a Spark without the Hadoop connector of a scheme is told."""
    return (
        f"this Spark has no Hadoop FileSystem for scheme {scheme!r} (S3: s3a:// with hadoop-aws "
        "and the AWS SDK bundle on the classpath; GCS: gs:// with the gcs-connector jar)"
    )


def _java_reason(exc: BaseException, full: bool = False) -> str:
    """The Java exception's class and message (first line), not py4j's wrapper text."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    if full:
        return text
    line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return line.removeprefix("java.io.").removeprefix("org.apache.hadoop.fs.")[:300]


def hadoop_resolver(spark_of: Callable[[], Any]) -> Callable[[str], tuple[pafs.FileSystem, str]]:
    """For `dppipeline.storage.remote_filesystems`: every remote URI through Hadoop."""
    built: list[pafs.FileSystem] = []

    def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
        if not built:
            built.append(pafs.PyFileSystem(HadoopFileSystem(spark_of())))
        return built[0], uri

    return resolve
