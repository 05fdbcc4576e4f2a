"""Small helpers at the bottom of the house: they import nothing of edgeheal.

:mod:`~edgeheal.base.log` (one logfmt line per event, repeats collapsed),
:mod:`~edgeheal.base.ifglob` (interface names against shell-style globs),
:mod:`~edgeheal.base.bare_import` (a package's submodules without its ``__init__``).
"""
