"""The sampling salt is a per-run secret: fresh each run, never printed, never published."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from support.data import release_small

from dppipeline.engines.base import ReleaseJob
from dppipeline.engines.kernel.sampling import SamplingKeys, new_salt


def secret_texts(salt: bytes) -> list[bytes]:
    """Every form the salt or the secrets derived from it could be written in."""
    keys = SamplingKeys.from_salt(salt)
    texts = [salt, salt.hex().encode(), base64.b64encode(salt), repr(salt).encode()]
    for secret in (keys.linf, keys.l0):
        texts += [str(secret).encode(), secret.to_bytes(8, "little", signed=True)]
    return texts


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_salt_is_in_no_output_and_no_log_line(small_inputs, tmp_path, engine, monkeypatch):
    """A run with a known salt (derived from a test seed): no line it prints and no byte of
    any file it writes (release, manifest, quarantine) holds the salt or its secrets."""
    from dppipeline.lifecycle import runner

    lines: list[str] = []
    seed = 1234
    original = runner.run_job

    def run_with_seed(spec, engine, **kwargs):
        kwargs["echo"] = lines.append
        return original(spec, engine, seed=seed, **kwargs)

    monkeypatch.setattr(runner, "run_job", run_with_seed)
    release_small(small_inputs, tmp_path, engine)
    forbidden = secret_texts(ReleaseJob.sampling_salt(seed))
    printed = "\n".join(lines).encode()
    assert lines and not [t for t in forbidden if t in printed]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in written)
    for path in written:
        data = path.read_bytes()
        assert not [t for t in forbidden if t in data], path


def test_salts_are_fresh_and_hidden_from_repr(tmp_path):
    salts = {ReleaseJob.sampling_salt() for _ in range(100)}
    assert len(salts) == 100 and all(len(s) == 16 for s in salts)
    assert ReleaseJob.sampling_salt(7) == ReleaseJob.sampling_salt(7) == new_salt(7)
    job = ReleaseJob(spec=None, plan=None, tasks=None, days=[], quarantine=Path("q"))
    assert job.salt.hex() not in repr(job) and "salt" not in repr(job)
