"""The pure core: snapshot + history + now -> verdicts and actions. No I/O, no clock read.

:mod:`~edgeheal.core.flannel_ladder` (restart Flannel when the tunnel is broken) and
:mod:`~edgeheal.core.uplink_ladder` (reconnect, bounce, re-authorize, reboot a stuck
modem) decide on their own evidence and share :mod:`~edgeheal.core.safeguards` (pause,
circuit, startup grace, cooldown, hourly budget); both read
:mod:`~edgeheal.core.path_verdict`. :mod:`~edgeheal.core.debounce` turns raw check results
into the effective states the snapshot holds. Every scenario is a table-driven test.
"""
