"""The demo keeps the terminal for progress: whatever goes to stderr (Dagster's DEBUG events, C code) lands in its log."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_stderr_of_python_loggers_and_raw_writes_goes_to_the_named_file(tmp_path):
    log = tmp_path / "home" / "demo.log"
    code = (
        "import logging, os, sys\n"
        "from pathlib import Path\n"
        "from dagster_project.demo import stderr_to_file\n"
        "logging.basicConfig(level=logging.DEBUG)\n"
        f"with stderr_to_file(Path({str(log)!r})):\n"
        "    logging.getLogger('dagster').debug('STEP_START - a debug event')\n"
        "    os.write(2, b'raw fd 2 write\\n')\n"
        "    print('progress line', flush=True)\n"
        "print('after', file=sys.stderr, flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "progress line\n"
    assert "STEP_START" not in proc.stderr and "after" in proc.stderr  # restored afterwards
    text = log.read_text()
    assert "STEP_START - a debug event" in text and "raw fd 2 write" in text
