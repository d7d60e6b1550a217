"""The user-facing API: `Kernel` (construct, inspect, call), the check against dense torch
and its independent reference, ``schedule="auto"``, and memory footprints. Below it, the
runtime runs executables and never sees a `Kernel`."""
