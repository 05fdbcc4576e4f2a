"""edgeheal: keeps a K3s edge node's Flannel WireGuard tunnel healthy and says so."""

__version__ = "0.2.0"
