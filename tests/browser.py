"""Headless Chromium (Debian's `chromium`) for the tests that look at pages as a reader would.

In CI (CI=true: .ci/run installs the package) a missing browser fails the test: a check that
skips on the machine meant to run it never runs. Elsewhere it skips, saying how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL = "apt-get update && apt-get install -y chromium"


def chromium() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true but no chromium on PATH: the browser tests must run in CI ({INSTALL}; .ci/run does)")
    pytest.skip(f"needs Debian's chromium ({INSTALL}); CI installs it and runs this test")


def dump_dom(page: Path, profile: Path, budget_ms: int = 5000) -> str:
    """The page's DOM after its scripts ran, with no network: every host name unresolvable and a
    dead proxy, so a page that needs a CDN renders without it, visibly (an empty table)."""
    out = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9",
                          "--host-resolver-rules=MAP * ~NOTFOUND", f"--virtual-time-budget={budget_ms}",
                          "--dump-dom", Path(page).as_uri()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
