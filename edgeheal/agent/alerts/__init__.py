"""Alerts: the closed kinds table, the payload, the durable outbox, and the engine.

Data flow: the agent's snapshots and events go to :mod:`edgeheal.agent.alerts.engine`, which
turns transitions (after debounce), reminders and recoveries into alerts
(:mod:`~edgeheal.agent.alerts.payload`), writes each to the SQLite outbox
(:mod:`~edgeheal.agent.alerts.outbox`) *before* anything else, and drains the outbox oldest first
over the kept-open MQTT connection (:mod:`edgeheal.boundaries.mqtt.link`), deleting a row only on
PUBACK. ``docs/alerts.md`` is the subscriber's guide.
"""
