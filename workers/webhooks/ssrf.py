"""Which addresses a webhook may be sent to (pure): the SSRF policy.

A callback URL is the caller's to choose, so it must not reach what sits beside the
dispatcher: loopback, private and link-local networks, multicast, reserved and unspecified
addresses, and the cloud metadata endpoints. A deployment that does want to call such an
address lists its network in ``webhook_allow_networks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

# Instance metadata services (AWS, GCP, Azure, OCI on IPv4; AWS on IPv6).
METADATA = frozenset({ip_address("169.254.169.254"), ip_address("fd00:ec2::254")})
_NAT64 = ip_network("64:ff9b::/96")


def _embedded_ipv4(address: Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped ::ffff:a.b.c.d, NAT64, 6to4)."""
    if isinstance(address, IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _why(address: Address) -> str | None:
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True, kw_only=True)
class AddressPolicy:
    allow: tuple[Network, ...] = ()

    def refusal(self, address: str | Address) -> str | None:
        """Why ``address`` may not be called, or None when it may."""
        ip = ip_address(address) if isinstance(address, str) else address
        if isinstance(ip, IPv6Address) and ip.scope_id:
            ip = IPv6Address(str(ip).split("%", 1)[0])
        inner = _embedded_ipv4(ip)
        if any(ip in net or (inner is not None and inner in net) for net in self.allow):
            return None
        # An address that stands for an IPv4 one is judged by it first.
        why = (_why(inner) if inner is not None else None) or _why(ip)
        return f"{ip} is {why}" if why else None
