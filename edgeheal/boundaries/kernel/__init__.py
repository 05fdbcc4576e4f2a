"""The kernel over rtnetlink and the ethtool ioctls, through the light pyroute2 import.

:mod:`~edgeheal.boundaries.kernel.ethtool` reads and switches off netdev features,
:mod:`~edgeheal.boundaries.kernel.link_events` streams ``RTM_NEWLINK``/``RTM_DELLINK``,
:mod:`~edgeheal.boundaries.kernel.interfaces` reads the uplink interfaces and bounces one;
all three share :mod:`~edgeheal.boundaries.kernel.pyroute2_light`.
"""
