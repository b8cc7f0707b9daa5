"""Where the Live page may connect: the operator's PAGED_LAB_LIVE_HOSTS (read by `core.limits`) as a `HostPolicy`,
and the classes of IP address it refuses unless the operator lists them. No DNS here: callers resolve a name once
(`core.live.addresses.resolve_checked`), check every address it gave, and connect to exactly a checked one.

Entries, comma separated:
- `*`: any globally routable (public) address, any port. Never a private, loopback, link-local or other special
  address: those must be listed by one of the entries below.
- `name` or `name:port`: that host name as the user writes it (case-insensitive). The addresses it resolves to
  may be public, private or loopback (the operator vouches for the name), never link-local (cloud metadata lives
  there), multicast, unspecified or reserved: those need an address or network entry.
- `1.2.3.4`, `1.2.3.4:port`, `[::1]`, `[::1]:port`: exactly that address, whatever its class.
- `10.0.0.0/8`, `fd00::/8`: any address in that network, whatever its class, any port.
Blank: `DEFAULT_LIVE_HOSTS`, the ports a lab-started `core.serve` listens on at 127.0.0.1 (`LAB_SERVER_PORTS`),
the same default as the Docker image's. `off`: nothing at all.

An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is the IPv4 address it maps, so `[::ffff:169.254.169.254]` is
link-local; the IPv4 address inside a NAT64 (64:ff9b::/96), 6to4 or Teredo address is classified too.
"""

import ipaddress
import re
from dataclasses import dataclass

from core.errors import LimitConfigError, LiveAddressRefusedError

VARIABLE = "PAGED_LAB_LIVE_HOSTS"
LAB_SERVER_PORTS = (8000, 5557, 5558)  # a lab-started core.serve on 127.0.0.1: HTTP, KV events, replay
DEFAULT_LIVE_HOSTS = ",".join(f"127.0.0.1:{port}" for port in LAB_SERVER_PORTS)
ANY_PUBLIC = "*"
OFF = "off"
PUBLIC = "public"
NEVER_BY_NAME = ("link-local", "multicast", "unspecified", "reserved")  # classes a name entry never reaches
_NAME = re.compile(r"^[a-z0-9_](?:[a-z0-9_.\-]*[a-z0-9_])?$")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_ip(text: str) -> IPAddress | None:
    """`text` (brackets and an IPv6 zone allowed) as an IP address, an IPv4-mapped one as its IPv4 address;
    None when it is not an address literal (a host name)."""
    try:
        ip = ipaddress.ip_address(text.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_class(ip: IPAddress) -> str:
    """ "public" for a globally routable address, else what it is: "unspecified", "loopback", "link-local",
    "multicast", "shared" (carrier-grade NAT, 100.64.0.0/10), "private", "site-local", "reserved" or
    "non-global" (any other special-purpose range). An IPv4 address embedded in an IPv6 one counts first."""
    for candidate in (*_embedded_ipv4(ip), ip):
        kind = _one_class(candidate)
        if kind != PUBLIC:
            return kind
    return PUBLIC


def _embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def _one_class(ip: IPAddress) -> str:
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("shared", isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
        ("non-global", not ip.is_global),
    )
    return next((kind for kind, hit in checks if hit), PUBLIC)


@dataclass(frozen=True)
class HostEntry:
    """One entry: `kind` "any" | "name" | "network" (an address is a network of one); `port` None: every port."""

    text: str
    kind: str
    name: str = ""
    network: IPNetwork | None = None
    port: int | None = None

    def port_ok(self, port: int) -> bool:
        return self.port is None or self.port == port


def parse_entry(text: str) -> HostEntry:
    """One entry (see the module doc). Raises ValueError saying what is wrong."""
    entry = text.strip()
    if entry == ANY_PUBLIC:
        return HostEntry(entry, "any")
    if "/" in entry:
        network = ipaddress.ip_network(entry.removeprefix("[").replace("]", ""), strict=False)
        return HostEntry(entry, "network", network=network)
    host, port = entry, None
    if entry.startswith("["):
        if "]" not in entry:
            raise ValueError("an IPv6 address in brackets needs its closing ]")
        host, _, rest = entry[1:].partition("]")
        if rest:
            port = _port(rest.removeprefix(":") if rest.startswith(":") else "x")
    elif entry.count(":") == 1:
        host, _, port_text = entry.partition(":")
        port = _port(port_text)
    ip = parse_ip(host)
    if ip is not None:
        return HostEntry(entry, "network", network=ipaddress.ip_network(ip), port=port)
    name = host.lower()
    if entry.startswith("[") or not _NAME.match(name) or len(name) > 253:
        raise ValueError("not a host name, address or network")
    return HostEntry(entry, "name", name=name, port=port)


def _is_range(entry: HostEntry) -> bool:
    """A network entry wider than one address: any name may resolve into it, so names are looked up."""
    return entry.kind == "network" and entry.network.prefixlen < entry.network.max_prefixlen


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65_535:
        raise ValueError("the port must be 1-65,535")
    return int(text)


@dataclass(frozen=True)
class HostPolicy:
    """The parsed PAGED_LAB_LIVE_HOSTS. `text` is the effective list (the default when the variable is blank)."""

    text: str
    entries: tuple[HostEntry, ...]
    off: bool = False
    default: bool = False

    @classmethod
    def parse(cls, value: str) -> "HostPolicy":
        """The policy for the variable's value. Raises LimitConfigError naming the bad entry."""
        value = (value or "").strip()
        if value.lower() == OFF:
            return cls(OFF, (), off=True)
        text = value or DEFAULT_LIVE_HOSTS
        entries = []
        for raw in text.split(","):
            try:
                entries.append(parse_entry(raw))
            except ValueError as err:
                raise LimitConfigError(
                    f"{VARIABLE} entry {raw.strip()!r} is not allowed ({err}); allowed: blank (the lab server's "
                    f"loopback ports {DEFAULT_LIVE_HOSTS}), 'off', or comma-separated entries: '*' (any public "
                    "host), host or host:port, an address (1.2.3.4, [::1]:8000) or a network (10.0.0.0/8)",
                    VARIABLE,
                ) from None
        return cls(text, tuple(entries), default=not value)

    @property
    def any_public(self) -> bool:
        return any(e.kind == "any" for e in self.entries)

    def admit(self, host: str, port: int, what: str) -> None:
        """Before any DNS lookup: may `host` (as the user wrote it) on `port` be connected to at all? An address
        literal is checked completely here; a name passes when `*`, a matching name entry or a network entry
        could allow what it resolves to. Raises LiveAddressRefusedError, naming the variable."""
        if self.off:
            raise LiveAddressRefusedError(
                f"refused: the Live page is turned off on this server ({VARIABLE}=off)", host, "off"
            )
        ip = parse_ip(host)
        if ip is not None:
            self.permit(host, str(ip), port, what)
            return
        name = host.lower()
        if self.any_public or any(
            (e.kind == "name" and e.name == name and e.port_ok(port)) or _is_range(e) for e in self.entries
        ):
            return
        raise LiveAddressRefusedError(
            f"refused: {what} {host}:{port} is not among the hosts this server may connect to ({self._shown()}; "
            f"{VARIABLE}): use one of them, or ask the operator to add it",
            host,
            "name",
        )

    def permit(self, host: str, address: str, port: int, what: str) -> None:
        """May the Live page connect to `address` (an IP that `host` resolved to, or `host` itself) on `port`?
        Raises LiveAddressRefusedError naming the address, its class and the variable."""
        ip = parse_ip(address)
        if ip is None:
            raise LiveAddressRefusedError(f"refused: {address!r} is not an IP address", address, "name")
        kind = address_class(ip)
        name = host.lower()
        for e in () if self.off else self.entries:
            if not e.port_ok(port):
                continue
            if (
                (e.kind == "network" and ip.version == e.network.version and ip in e.network)
                or (e.kind == "name" and e.name == name and kind not in NEVER_BY_NAME)
                or (e.kind == "any" and kind == PUBLIC)
            ):
                return
        article = "an" if kind[0] in "aeiou" else "a"
        raise LiveAddressRefusedError(
            f"refused: address {ip} is {article} {kind} address not in {VARIABLE} ({self._shown()}), for {what} "
            f"{host}:{port}",
            str(ip),
            kind,
        )

    def _shown(self) -> str:
        if self.off:
            return OFF
        return f"the default {self.text}" if self.default else self.text
