"""Issue 27, finding 10: ``edgeheal check-config | head`` printed a BrokenPipe traceback.

Now a command whose reader went away ends quietly with 141 (128 + SIGPIPE), as a shell
reports it for other programs. The pipe's read end is closed before the command starts, so
its first write fails whatever the timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("argv", [["check-config", "--config", "{config}"],
                                  ["check-config", "--reference"],
                                  ["alert", "kinds"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path,
                                                          argv: list[str]) -> None:
    config = tmp_path / "edgeheal.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n'
                      '[wireguard]\nenabled = false\n')
    read_end, write_end = os.pipe()
    os.close(read_end)  # `head` has already gone
    try:
        proc = subprocess.run([sys.executable, "-m", "edgeheal",
                               *(a.format(config=config) for a in argv)],
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60,
                              check=False)
    finally:
        os.close(write_end)
    err = proc.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    assert "BrokenPipe" not in err, err
    assert proc.returncode == 141, err
