"""No phone-home: OpenVINO's and NNCF's usage telemetry stay off.

Both use the `openvino_telemetry` package, which sends events only when a
consent file under ~/intel says "1". We write "0" there before either library
can ask, using the package's own writer (it only writes the file; unlike the
`opt_in_out --opt_out` tool it sends no opt-out event). Where the home folder
is not writable (a locked-down service user), no consent file means no
consent, so the result is the same: nothing is sent.
"""

from __future__ import annotations

import contextlib
import os


def disable_usage_telemetry() -> None:
    """Record a declined consent for OpenVINO usage telemetry, without network I/O."""
    # NNCF checks these at import and then uses a stub that never sends.
    os.environ.setdefault("NNCF_CI", "1")
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:  # the package is optional for the runtime; absent means nothing is sent
        return
    with contextlib.suppress(OSError):
        OptInChecker().update_result(ConsentCheckResult.DECLINED)
