"""One-shot tools an operator runs by hand; the agent never imports them.

:mod:`~edgeheal.tools.doctor` checks a node's setup (``edgeheal doctor``) and
:mod:`~edgeheal.tools.diagnose` captures and explains one tunnel stall (``edgeheal
diagnose``). Both read the same boundaries as the agent, and neither changes anything.
:mod:`~edgeheal.tools.bundle` (``edgeheal bundle``) runs the doctor (and, asked, a short
diagnose) and gathers them with the agent's state into one support archive, secrets
redacted.
"""
