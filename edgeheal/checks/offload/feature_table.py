"""The kernel's netdev feature names (``net/ethtool/common.c``: ``netdev_features_strings``).

Config validation uses this static table so that ``check-config`` needs no netlink and an
unknown name is an error at start-up (exit 2) that lists the valid ones. It is the union of
names used by kernels 5.10 - 6.18; a name listed here that a given kernel lacks shows up at
run time as ``not-present`` rather than as a config error. ``ethtool -k`` also prints a few
legacy aliases (``tx-checksumming``, ``rx-checksumming``...); those are not kernel feature
names and are not accepted.
"""

KERNEL_FEATURES: tuple[str, ...] = (
    "tx-scatter-gather", "tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-ipv6",
    "highdma", "tx-scatter-gather-fraglist", "tx-vlan-hw-insert", "rx-vlan-hw-parse",
    "rx-vlan-filter", "tx-vlan-stag-hw-insert", "rx-vlan-stag-hw-parse", "rx-vlan-stag-filter",
    "vlan-challenged", "tx-generic-segmentation", "tx-lockless", "netns-local", "rx-gro",
    "rx-gro-hw", "rx-lro", "tx-tcp-segmentation", "tx-gso-robust", "tx-tcp-ecn-segmentation",
    "tx-tcp-mangleid-segmentation", "tx-tcp6-segmentation", "tx-tcp-accecn-segmentation",
    "tx-fcoe-segmentation", "tx-gre-segmentation", "tx-gre-csum-segmentation",
    "tx-ipxip4-segmentation", "tx-ipxip6-segmentation", "tx-udp_tnl-segmentation",
    "tx-udp_tnl-csum-segmentation", "tx-gso-partial", "tx-tunnel-remcsum-segmentation",
    "tx-sctp-segmentation", "tx-esp-segmentation", "tx-udp-segmentation", "tx-gso-list",
    "tx-checksum-fcoe-crc", "tx-checksum-sctp", "fcoe-mtu", "rx-ntuple-filter", "rx-hashing",
    "rx-checksum", "tx-nocache-copy", "loopback", "rx-fcs", "rx-all", "l2-fwd-offload",
    "hw-tc-offload", "esp-hw-offload", "esp-tx-csum-hw-offload", "rx-udp_tunnel-port-offload",
    "tls-hw-record", "tls-hw-tx-offload", "tls-hw-rx-offload", "rx-gro-list",
    "macsec-hw-offload", "rx-udp-gro-forwarding", "hsr-tag-ins-offload", "hsr-tag-rm-offload",
    "hsr-fwd-offload", "hsr-dup-offload",
)
