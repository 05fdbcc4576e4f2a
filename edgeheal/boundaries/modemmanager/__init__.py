"""ModemManager over D-Bus: read the modems' state, reconnect a data session.

Why ModemManager's API and nothing lower: where ModemManager runs it owns the modem (its
AT/QMI/MBIM ports, the data session, the bearer's settings). Talking to the modem behind its
back races it; asking it to ``Simple.Disconnect`` and ``Simple.Connect`` again is what
``mmcli --simple-disconnect``/``--simple-connect`` do, and it keeps the session's own
settings (APN, IP type, credentials) because we hand back the bearer's ``Properties``.

Two modules:

- :mod:`~edgeheal.boundaries.modemmanager.readings`: what is read (the service's names, the
  properties and what their values mean, the bounds), :class:`~.readings.Modem` and
  :class:`~.readings.Bearer`, and :class:`~.readings.ModemError`; checking a reply is pure;
- :mod:`~edgeheal.boundaries.modemmanager.client`: :class:`~.client.ModemManager`, the
  calls (read every modem, reconnect, enable), the connection and the errors of the bus.
"""
