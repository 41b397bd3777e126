"""What the tests share that is not a fixture: servers, data builders, the CLI runner.

`tests/` is on the import path (pyproject's `pythonpath`), so tests import `support.cli`,
`support.data`, ...; fixtures stay in `tests/conftest.py`, which every test folder sees.
Paths are computed here once, so that moving a test file changes none of them.
"""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
