"""The SSRF address policy: what a webhook may never be sent to, unless allow-listed."""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from workers.webhooks.ssrf import AddressPolicy

POLICY = AddressPolicy()


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("10.255.255.254", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.10.10", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%2", "link-local"),
        ("fc00::1", "private"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "private"),  # reserved (class E); Python files it under private too
        ("100.64.0.1", "not globally routable"),  # carrier-grade NAT
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "metadata"),
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ],
)
def test_refused(address: str, why: str) -> None:
    refusal = POLICY.refusal(address)
    assert refusal is not None
    assert why in refusal


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert POLICY.refusal(address) is None


def test_the_allow_list_opens_only_its_networks() -> None:
    policy = AddressPolicy(allow=(ip_network("127.0.0.0/8"), ip_network("10.1.0.0/16")))
    assert policy.refusal("127.0.0.1") is None
    assert policy.refusal("::ffff:127.0.0.1") is None
    assert policy.refusal("10.1.2.3") is None
    assert policy.refusal("10.2.0.1") is not None
    assert policy.refusal("::1") is not None
    assert policy.refusal("169.254.169.254") is not None
