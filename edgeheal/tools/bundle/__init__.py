"""``edgeheal bundle``: everything support asks for, in one size-bounded archive, no secret.

Why: field support asks the same five questions of every node (which version, what does
``doctor`` say, what is ``/status``, what did the ladders do, what did the log say), and the
answers live in five places. This package gathers them once, in three steps, one module
each:

- :mod:`~edgeheal.tools.bundle.members` reads every member (the table there), each made
  with what can be read *now*: with the agent down, ``/status`` and ``/metrics`` are an
  error line and the histories and the outbox are read from the state directory; offline,
  doctor's network rows fail within their own deadlines (:func:`~.members.collect`);
- :mod:`~edgeheal.tools.bundle.redaction` takes every secret out of each member before it
  is archived (:func:`~.redaction.scrub`): **no secret leaves the node**;
- :mod:`~edgeheal.tools.bundle.archive` cuts the members to the size bound, adds the
  manifest and writes one tar.gz (:func:`~.archive.write`): **bounded**.
"""
