"""Making a test's child process obey file permissions, also when the tests run as root."""

from __future__ import annotations

import ctypes
import os


def obey_file_permissions() -> None:
    """A `preexec_fn`: drop root's permission overrides from the capability bounding set, so
    the exec'd child is refused an unwritable folder like any user."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop = 24
    for capability in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(pr_capbset_drop, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
