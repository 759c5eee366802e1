"""The progress line: counts, rates, spend, retry causes; plain lines when stderr is not a terminal."""

from __future__ import annotations

import asyncio
import io

from draftgate.client.progress import Progress


def test_the_line_reports_done_failures_spend_retries_and_eta():
    p = Progress(10, stream=io.StringIO())
    p.finished(True, 40, 0.5)
    p.finished(False, 0, 0.5)
    p.error("http_429")
    p.error("http_429")
    line = p.line()
    assert line.startswith("generate 2/10 (1 failed)")
    assert "$0.5000" in line and "retries: http_429=2" in line and "ETA" in line


def test_without_a_terminal_it_prints_plain_lines_at_the_chosen_interval():
    out = io.StringIO()

    async def go():
        p = Progress(3, stream=out, plain_every_s=0.05)
        p.start()
        await asyncio.sleep(0.18)
        p.finished(True, 1, 0.0)
        p.close()

    asyncio.run(go())
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 5 and "\r" not in out.getvalue()
    assert lines[-1].startswith("generate 1/3")
