"""``python -m tests.doctor.rundoctor ARGS``: the ``edgeheal`` command line with the kernel's
clock state injected (``EDGEHEAL_TEST_CLOCK=synced|unsynced``).

The end-to-end tests run the real command in a lab namespace; the one thing they cannot
arrange for real is the host's NTP status (changing the host's clock is never an option,
and this machine's kernel reports it unsynchronized), so only the adjtimex reader is
replaced, before the command builds its :class:`~edgeheal.tools.doctor.system.System`.
"""

from __future__ import annotations

import os
import sys

from edgeheal import cli
from edgeheal.tools.doctor import system
from tests.doctor.support import SYNCED, UNSYNCED

if __name__ == "__main__":
    state = {"synced": SYNCED, "unsynced": UNSYNCED}[os.environ["EDGEHEAL_TEST_CLOCK"]]
    system.kernel_clock = lambda: state
    sys.exit(cli.main(sys.argv[1:]))
