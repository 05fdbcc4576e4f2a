"""Command groups beyond the spine of ``edgeheal``: one module each, found by ``cli``."""
