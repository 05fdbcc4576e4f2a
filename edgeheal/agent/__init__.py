"""The running agent: the supervisor and what reads its snapshot.

:mod:`~edgeheal.agent.supervisor` runs the checks, keeps the one snapshot and stops in
order; :mod:`~edgeheal.agent.endpoints` (probes, ``/status``, ``/metrics``),
:mod:`~edgeheal.agent.alerts` and :mod:`~edgeheal.agent.remediation` read that snapshot and
never each other. Nothing here is imported to build the command line: ``edgeheal run``
loads it.
"""
